"""Log files in the run directory: `<run_dir>/logs/driver.log` and `<run_dir>/logs/worker-<rank>.log`.

Why: a pod's log goes with the pod. Once a job has finished, failed or been retried on a new Ray
cluster, `kubectl logs` has nothing left, yet that is when the progress lines, the resume notes and
an error's traceback are wanted. The driver and every training worker therefore also append each
log record they print to a file on the shared storage, where `llmtrain logs NAME --saved` reads them
(and `llmtrain run` leaves the same files in the local run directory).

- Each record is flushed as it is written (logging.FileHandler flushes per record), so a killed pod
  leaves everything it logged up to the kill.
- A retry, a resume or a worker restart appends to the same file after a separator line naming the
  attempt, so the file tells the whole run.
- The directory is 0755 and the files 0644 whatever the umask: like the exported model, they are
  read by other pods of the job's fsGroup (the `--saved` reader) and by people on the volume.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from llmtrain.constants import SAVED_LOGS_DIR

DRIVER_LOG = "driver.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def worker_log(rank: int) -> str:
    return f"worker-{rank}.log"


def logs_dir(run_dir: Path) -> Path:
    return run_dir / SAVED_LOGS_DIR


class RunLogHandler(logging.FileHandler):
    """Appends records to a file shared with the group; the file is created 0644 and flushed per
    record (the base class's `emit` flushes)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o755)
        # Create it with the shared mode first: FileHandler's open() would take the umask's.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        path.chmod(0o644)
        super().__init__(path, mode="a", encoding="utf-8")
        self.setFormatter(logging.Formatter(FORMAT))
        self.setLevel(logging.INFO)


def _attempt_header(what: str) -> str:
    """`===== worker rank 0 attempt started 2026-11-26T17:00:00Z on host pod-x (pid 12) =====`."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f"===== {what} attempt started {stamp} on {socket.gethostname()} (pid {os.getpid()}) ====="


def attach(path: Path, what: str, logger: logging.Logger | None = None) -> RunLogHandler | None:
    """Append `logger`'s records (the root logger's by default: every module's that propagates) to
    `path` after a separator line naming this attempt. Returns the handler for `detach`, or None
    when the file cannot be opened (a read-only volume must not stop training; the pod log still
    has everything)."""
    target = logger or logging.getLogger()
    try:
        handler = RunLogHandler(path)
    except OSError as exc:
        logging.getLogger(__name__).warning("not saving the log to %s: %s", path, exc)
        return None
    if handler.stream is not None:
        handler.stream.write(_attempt_header(what) + "\n")
        handler.flush()
    target.addHandler(handler)
    return handler


def detach(handler: RunLogHandler | None, logger: logging.Logger | None = None) -> None:
    if handler is None:
        return
    (logger or logging.getLogger()).removeHandler(handler)
    handler.close()


def note(handler: RunLogHandler | None, message: str, level: int = logging.ERROR) -> None:
    """Write a line to the saved log only: for messages the process prints itself (its one-line
    `error:` output), which would otherwise reach stderr twice."""
    if handler is not None:
        handler.handle(logging.LogRecord("llmtrain_trainer", level, __file__, 0, message, None, None))


def attach_driver(run_dir: Path) -> RunLogHandler | None:
    return attach(logs_dir(run_dir) / DRIVER_LOG, "driver")


def attach_worker(run_dir: Path, rank: int) -> RunLogHandler | None:
    return attach(logs_dir(run_dir) / worker_log(rank), f"worker rank {rank}")
