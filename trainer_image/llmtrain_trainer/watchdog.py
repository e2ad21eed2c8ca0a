"""A step-progress watchdog: say which rank stopped making progress, and since which step, long
before the process-group timeout ends the run.

A hung collective (a dead NIC, a rank stuck in I/O or a data loader) blocks every rank silently
until torch.distributed's timeout (network.collectiveTimeoutSeconds, 30 minutes by default) aborts
the job with an error that names neither the step nor the cause. Each worker therefore runs a
daemon thread that notes when a training step last completed; past a threshold well under that
timeout it logs loudly, and rank 0 puts the stall into status.progress.error (one writer), and
clears the error when steps complete again.

In a hang every rank stalls together, so the stalled rank alone cannot say who is stuck. Each
watchdog therefore publishes its rank's phase (a small file per rank in a board folder on the
shared storage, written by the watchdog thread when it changes, never by the training loop): a rank
that has loaded its step's data and entered the step's collectives waits for the others; the one
still outside them (data loading, storage, host work) at the lowest step is the stuck one, and
rank 0's report names it. A checkpoint or an evaluation pauses the watchdog: a long synchronous
save is not a stall.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

STALL_FRACTION_OF_TIMEOUT = 1 / 3
"""Report a stall after this share of the process-group timeout without a completed step: late
enough that a checkpoint save or an evaluation between two steps does not trip it (each is bounded
by that timeout too), early enough that someone can look at the hung rank before the run dies."""


def stall_threshold_seconds(collective_timeout_seconds: float) -> float:
    return collective_timeout_seconds * STALL_FRACTION_OF_TIMEOUT


WATCHDOG_DIR = ".watchdog"
"""The board's folder in the run directory."""

OUTSIDE = "outside collectives"
"""Between steps: loading data, host work, storage; a rank hung here is what the others wait for."""
INSIDE = "in the step's collectives"
"""The step's data is loaded: forward, backward and optimizer step, whose collectives wait for
every rank."""


def stuck_ranks(board: Path, world_size: int) -> str:
    """Which ranks the others wait for, from every rank's published phase; "" when it cannot say
    (a file of a rank beyond `world_size` is an earlier attempt's)."""
    phases: dict[int, tuple[int, str]] = {}
    for path in board.glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = json.loads(path.read_text())
            if int(data["rank"]) < world_size:
                phases[int(data["rank"])] = (int(data["step"]), str(data["phase"]))
    if not phases:
        return ""
    lowest = min(step for step, _ in phases.values())
    behind = sorted(rank for rank, (step, _) in phases.items() if step == lowest)
    outside = [rank for rank in behind if phases[rank][1] == OUTSIDE]
    if outside and len(outside) < len(phases):
        names = ", ".join(str(rank) for rank in outside)
        return (
            f"stuck: rank {names} (at step {lowest}, {OUTSIDE}: data, storage or host work; the others wait)"
        )
    if len(behind) < len(phases):
        names = ", ".join(str(rank) for rank in behind)
        return f"stuck: rank {names} (behind, at step {lowest}; the others wait in step {lowest + 1})"
    if all(phase == INSIDE for _, phase in phases.values()):
        return "every rank waits inside the step's collectives: look at the network (NCCL) and at each GPU"
    return ""


@dataclass(frozen=True)
class Stall:
    """One rank without a completed step for `seconds` since `last_step`."""

    rank: int
    last_step: int
    seconds: float
    timeout_seconds: float
    stuck: str = ""
    """Which rank the others wait for (`stuck_ranks`), when the board says."""

    @property
    def message(self) -> str:
        where = (
            f"{self.stuck}. Look at that rank's stack (py-spy dump) and its node's network and storage"
            if self.stuck
            else "a rank is stuck (a hung collective, storage or data loading). Look at the ranks' "
            "stacks (py-spy dump) and their nodes' network and storage"
        )
        return (
            f"rank {self.rank}: no training step completed for {self.seconds:.0f}s since step "
            f"{self.last_step}; the process-group timeout will end the run after "
            f"{self.timeout_seconds:.0f}s; {where}"
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
        board: Path | None = None,
        world_size: int = 1,
    ) -> None:
        """`board`: the shared folder where each of the `world_size` ranks publishes its phase
        (None: no naming)."""
        self.world_size = world_size
        self.rank = rank
        self.reporter = reporter
        self.clock = clock
        self.board = board
        self.set_timeout(timeout_seconds)
        self.poll = poll_seconds if poll_seconds is not None else min(30.0, self.threshold / 10)
        self._lock = threading.Lock()
        self._last_step = 0
        self._last_time = clock()
        self._phase = OUTSIDE
        self._paused = False
        self._published: tuple[int, str] | None = None
        self._stall: Stall | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"llmtrain-watchdog-{rank}", daemon=True)

    def set_timeout(self, timeout_seconds: float) -> None:
        """The process-group timeout now in effect (shorter once training runs: distributed.py)."""
        self.timeout = timeout_seconds
        self.threshold = stall_threshold_seconds(timeout_seconds)

    def start(self, step: int) -> None:
        self.beat(step)
        self.publish()  # over an earlier attempt's file before any stall can be judged
        self._thread.start()

    def beat(self, step: int) -> None:
        """A step completed (or the loop is about to take its first one): this rank is now outside
        the collectives, loading the next step's data."""
        with self._lock:
            self._last_step, self._last_time, self._phase = step, self.clock(), OUTSIDE
            stall, self._stall = self._stall, None
        if stall is not None:
            self.reporter.recovered(stall, step)

    def entering_collectives(self) -> None:
        """The step's data is loaded; from here this rank waits for the others (an assignment)."""
        self._phase = INSIDE

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """A checkpoint or an evaluation: not a stall however long it takes (its collectives keep
        their own timeout); the clock restarts after it."""
        with self._lock:
            self._paused = True
        try:
            yield
        finally:
            with self._lock:
                self._paused, self._last_time = False, self.clock()

    def check(self) -> Stall | None:
        """The stall to report now, if the last step is older than the threshold and not yet reported."""
        with self._lock:
            waited = self.clock() - self._last_time
            if self._paused or self._stall is not None or waited < self.threshold:
                return None
            self._stall = Stall(self.rank, self._last_step, waited, self.timeout)
            stall = self._stall
        if self.board is not None:
            self.publish()
            stuck = stuck_ranks(self.board, self.world_size)
            if stuck:
                with self._lock:
                    self._stall = stall = Stall(
                        stall.rank, stall.last_step, stall.seconds, stall.timeout_seconds, stuck
                    )
        return stall

    def publish(self) -> None:
        """Write this rank's step and phase to the board when they changed (the watchdog thread)."""
        if self.board is None:
            return
        current = (self._last_step, self._phase)
        if current == self._published:
            return
        try:
            self.board.mkdir(parents=True, exist_ok=True)
            path = self.board / f"rank-{self.rank}.json"
            partial = path.with_name(f".{path.name}.partial")
            partial.write_text(json.dumps({"rank": self.rank, "step": current[0], "phase": current[1]}))
            partial.replace(path)
            self._published = current
        except OSError:
            log.warning("could not publish rank %d's phase to %s", self.rank, self.board, exc_info=True)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(self.poll + 1)
        self.reporter.close()

    def _run(self) -> None:
        while not self._stopped.wait(self.poll):
            self.publish()
            stall = self.check()
            if stall is None:
                continue
            try:
                self.reporter.stalled(stall)
            except Exception:  # the watchdog must never take the worker down
                log.exception("reporting a stall failed")
