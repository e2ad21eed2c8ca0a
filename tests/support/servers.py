"""Start a test's local server process and stop it with the test: listening on 127.0.0.1 only,
in its own session (so SIGTERM reaches the whole group), its output in a log file that failures quote."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def listening(
    name: str,
    command: list[str],
    port: int,
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` until the block ends; yield once 127.0.0.1:`port` accepts connections."""
    log = log_path.open("wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"{name} exited {server.returncode}: {log_path.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not listening after {timeout} s: {log_path.read_text()}")
            time.sleep(0.1)
        yield server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
