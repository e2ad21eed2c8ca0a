"""Wait, at the point of use, for a build `make test` runs in the background.

`make test` starts the Go build of the cluster's binaries, the image build and the build of kind's
node image in the background (the Makefile's `background`: the step's output in LOG, its process id in
LOG.pid, its exit status in LOG.rc once it ends) and starts the test lanes without waiting for
them, with each log's path in LLMTRAIN_TOOLS_LOG, LLMTRAIN_IMAGES_LOG and LLMTRAIN_KIND_LOG. A test
that needs the binaries, the images or the node image calls `tools_built()`, `images_built()` or
`kind_built()` first: it waits for that step to end, and fails with the log's
tail when the step failed (or ended without a status: killed). Then the caller's own
`build_tools.ensure` or `images.ensure` only finds what the step made. Without the variable (pytest
run directly) nothing is awaited and the caller builds in-process as before; the builds' per-name
locks keep two builds of one thing from running at once either way.

Every wait is recorded in WAITS; tests/conftest.py prints them at the end of the session, so each
lane's log says how long its tests waited for which build.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = {"tools": "LLMTRAIN_TOOLS_LOG", "images": "LLMTRAIN_IMAGES_LOG", "kind": "LLMTRAIN_KIND_LOG"}
TAIL_LINES = 50
WAITS: list[str] = []
_done: set[str] = set()


class BuildFailed(RuntimeError):
    """The background build failed or was killed; the message holds its log's tail."""


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: kill's answer stands
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@contextmanager
def _timeout_paused() -> Iterator[None]:
    """Stop the clock of the test's timeout (pytest-timeout arms SIGALRM's real-time timer) while
    it waits: a cold Go build takes longer than any one test may, and is not the test's time."""
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    if remaining:
        signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if remaining:
            signal.setitimer(signal.ITIMER_REAL, remaining, interval)


def wait(log: Path, poll: float = 0.2) -> float:
    """Wait for the background step writing `log` to end; the seconds waited. Raises BuildFailed
    unless it ended with status 0."""
    started = time.monotonic()
    pid_file, rc_file = Path(f"{log}.pid"), Path(f"{log}.rc")
    pid = _read(pid_file)
    with _timeout_paused():
        while not _read(rc_file) and pid.isdigit() and _alive(int(pid)):
            time.sleep(poll)
    waited = time.monotonic() - started
    rc = _read(rc_file)
    if rc == "0":
        return waited
    if rc:
        why = f"failed (exit status {rc})"
    elif pid:
        why = f"ended without an exit status (process {pid} killed?)"
    else:
        why = f"never started (no {pid_file.name})"
    tail = "\n".join(_read(log).splitlines()[-TAIL_LINES:])
    raise BuildFailed(f"the background build writing {log} {why}; its last lines:\n{tail}\nfailed: see {log}")


def await_build(kind: str) -> float | None:
    """Wait for the background build of `kind` ("tools", "images" or "kind") if `make test` started one:
    the seconds waited (0 after the first wait), or None when there is none to wait for."""
    log = os.environ.get(ENV[kind])
    if not log:
        return None
    if kind in _done:
        return 0.0
    waited = wait(Path(log))
    _done.add(kind)
    test = os.environ.get("PYTEST_CURRENT_TEST", "outside a test").rsplit(" (", 1)[0]
    WAITS.append(f"waited {waited:.1f} s for the background {kind} build ({log}), first needed by {test}")
    return waited


def tools_built() -> None:
    """Before the cluster's Go binaries (or the test servers') are used."""
    await_build("tools")


def images_built() -> None:
    """Before the operator or trainer image is used."""
    await_build("images")


def kind_built() -> None:
    """Before the kind end-to-end run (tests/e2e/test_kind.py): kind's node image and Podman."""
    await_build("kind")
