"""Start a test's local server process and stop it with the test: listening on 127.0.0.1 (or an
address inside a network namespace the tests made), in its own session (so SIGTERM reaches the whole
group), its output in a log file that failures quote. Also what the object-store servers share."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyarrow import fs as pafs


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def listening(
    name: str,
    command: list[str],
    port: int,
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    *,
    host: str = "127.0.0.1",
    ready: Callable[[], bool] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` until the block ends; yield once `ready()` holds (by default: `host`:`port`
    accepts connections)."""
    is_ready = ready or (lambda: _accepts(host, port))
    log = log_path.open("wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + timeout
        while not is_ready():
            if server.poll() is not None:
                raise RuntimeError(f"{name} exited {server.returncode}: {log_path.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout} s: {log_path.read_text()}")
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


def bucket_keys(client: pafs.FileSystem, bucket: str) -> list[str]:
    """Every object name of a bucket (container), listed through the store's own API."""
    from pyarrow import fs

    found = client.get_file_info(fs.FileSelector(bucket, recursive=True))
    return sorted(i.path.removeprefix(bucket + "/") for i in found if i.type == fs.FileType.File)


def settled_log(client: pafs.FileSystem, log: Path) -> list[str]:
    """A server's access log once every request answered so far is in it: servers write a line
    after their response, so a marker request's line (they are served in order) is waited for."""
    from pyarrow import fs

    marker = f"log-marker-{uuid.uuid4().hex}"
    client.get_file_info(fs.FileSelector(marker, allow_not_found=True))
    deadline = time.monotonic() + 10
    while marker not in (text := log.read_text()):
        assert time.monotonic() < deadline, f"no request for {marker} in {log}"
        time.sleep(0.05)
    return text.splitlines()
