"""Start, find and stop the cluster's processes.

Each component runs in its own session (process group) with its output in `<dir>/logs/<name>.log`,
and its pid is written to `<dir>/pids/<name>`, so `make cluster-down` (another process, later)
can stop exactly what `make cluster` started and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(
    directory: Path,
    name: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> int:
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    (directory / "pids").mkdir(parents=True, exist_ok=True)
    with (directory / "logs" / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            pass_fds=pass_fds,
        )
    (directory / "pids" / name).write_text(str(proc.pid))
    return proc.pid


def alive(pid: int) -> bool:
    try:
        # A zombie child still answers kill(0); reap it if it is ours.
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie whose parent is gone (`make cluster` exited) waits for init to reap it, which
    # here takes seconds: it has exited all the same.
    with contextlib.suppress(OSError, IndexError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def running(directory: Path) -> dict[str, int]:
    pids = directory / "pids"
    found = {p.name: int(p.read_text()) for p in pids.iterdir()} if pids.is_dir() else {}
    return {name: pid for name, pid in found.items() if alive(pid)}


def stop(directory: Path, name: str, timeout: float = 10.0) -> None:
    pidfile = directory / "pids" / name
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(pid, signal.SIGKILL)
    while alive(pid) and time.monotonic() < deadline + 5:
        time.sleep(0.05)
    pidfile.unlink(missing_ok=True)


def stop_all(directory: Path, order: list[str]) -> None:
    """Stop the named components in order, then anything else still recorded."""
    pids = directory / "pids"
    rest = sorted(p.name for p in pids.iterdir()) if pids.is_dir() else []
    for name in [*order, *(n for n in rest if n not in order)]:
        stop(directory, name)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
