"""A step-progress watchdog: say which rank stopped making progress, and since which step, long
before the process-group timeout ends the run.

A hung collective (a dead NIC, a rank stuck in I/O or a data loader) blocks every rank silently
until torch.distributed's timeout (network.collectiveTimeoutSeconds, 30 minutes by default) aborts
the job with an error that names neither the step nor the cause. Each worker therefore runs a
daemon thread that notes when a training step last completed; past a threshold well under that
timeout it logs loudly and puts the stall into status.progress.error (any worker may patch its
job's status), and it clears the error when steps complete again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

STALL_FRACTION_OF_TIMEOUT = 1 / 3
"""Report a stall after this share of the process-group timeout without a completed step: late
enough that a checkpoint save or an evaluation between two steps does not trip it (each is bounded
by that timeout too), early enough that someone can look at the hung rank before the run dies."""


def stall_threshold_seconds(collective_timeout_seconds: float) -> float:
    return collective_timeout_seconds * STALL_FRACTION_OF_TIMEOUT


@dataclass(frozen=True)
class Stall:
    """One rank without a completed step for `seconds` since `last_step`."""

    rank: int
    last_step: int
    seconds: float
    timeout_seconds: float

    @property
    def message(self) -> str:
        return (
            f"rank {self.rank}: no training step completed for {self.seconds:.0f}s since step "
            f"{self.last_step}; a rank is stuck (a hung collective, storage or data loading) and the "
            f"process-group timeout will end the run after {self.timeout_seconds:.0f}s. Look at this "
            "rank's stack (py-spy dump) and its node's network and storage"
        )


class ErrorSink(Protocol):
    """Where a stall is reported besides the log (kube_progress.KubernetesProgressSink)."""

    def report_error(self, message: str | None) -> None: ...

    def close(self, flush_timeout: float = 10.0) -> None: ...


class StallReporter:
    """Logs a stall loudly and reports it through an error sink opened on the first stall."""

    def __init__(self, open_sink: Callable[[], ErrorSink | None]) -> None:
        self._open_sink = open_sink
        self._sink: ErrorSink | None = None
        self._opened = False

    def stalled(self, stall: Stall) -> None:
        log.error("TRAINING STALLED: %s", stall.message)
        if not self._opened:
            self._opened = True
            self._sink = self._open_sink()
        if self._sink is not None:
            self._sink.report_error(stall.message)

    def recovered(self, stall: Stall, step: int) -> None:
        log.warning(
            "rank %d: training continues (step %d) after a stall at step %d",
            stall.rank,
            step,
            stall.last_step,
        )
        if self._sink is not None:
            self._sink.report_error(None)

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()


class StepWatchdog:
    """A daemon thread on one worker that reports once per stall (re-armed by the next step).

    `beat` is all the training loop calls: a lock and two assignments, no device sync.
    """

    def __init__(
        self,
        rank: int,
        timeout_seconds: float,
        reporter: StallReporter,
        clock: Callable[[], float] = time.monotonic,
        poll_seconds: float | None = None,
    ) -> None:
        self.rank = rank
        self.reporter = reporter
        self.clock = clock
        self.set_timeout(timeout_seconds)
        self.poll = poll_seconds if poll_seconds is not None else min(30.0, self.threshold / 10)
        self._lock = threading.Lock()
        self._last_step = 0
        self._last_time = clock()
        self._stall: Stall | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"llmtrain-watchdog-{rank}", daemon=True)

    def set_timeout(self, timeout_seconds: float) -> None:
        """The process-group timeout now in effect (shorter once training runs: distributed.py)."""
        self.timeout = timeout_seconds
        self.threshold = stall_threshold_seconds(timeout_seconds)

    def start(self, step: int) -> None:
        self.beat(step)
        self._thread.start()

    def beat(self, step: int) -> None:
        """A step completed (or the loop is about to take its first one)."""
        with self._lock:
            self._last_step, self._last_time = step, self.clock()
            stall, self._stall = self._stall, None
        if stall is not None:
            self.reporter.recovered(stall, step)

    def check(self) -> Stall | None:
        """The stall to report now, if the last step is older than the threshold and not yet reported."""
        with self._lock:
            waited = self.clock() - self._last_time
            if self._stall is not None or waited < self.threshold:
                return None
            self._stall = Stall(self.rank, self._last_step, waited, self.timeout)
            return self._stall

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(self.poll + 1)
        self.reporter.close()

    def _run(self) -> None:
        while not self._stopped.wait(self.poll):
            stall = self.check()
            if stall is None:
                continue
            try:
                self.reporter.stalled(stall)
            except Exception:  # the watchdog must never take the worker down
                log.exception("reporting a stall failed")
