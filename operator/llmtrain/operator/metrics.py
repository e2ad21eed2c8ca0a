"""Prometheus metrics of the operator (served on --metrics-port).

The endpoint starts before the leader election, so a standby serves it too: it says
`llmtrain_leader 0` and nothing about jobs or resyncs, which only the acting process knows (zeros
would read as "no jobs" next to the leader's real counts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmtrain.api.status import PHASES

# Phases of a finished job: labelled so, it leaves Kopf's view, and the resync counts it instead.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

LEADER = Gauge(
    "llmtrain_leader",
    "1 while this process acts on jobs (it holds the Lease, or runs without election); 0 on standby",
)
JOBS = Gauge(
    "llmtrain_jobs",
    "LLMTrainingJobs by phase: those at work as last seen or written by this operator, the finished "
    "ones as counted by its last resync pass",
    ["phase"],
)
RECONCILE_SECONDS = Histogram(
    "llmtrain_reconcile_duration_seconds",
    "Time to reconcile one LLMTrainingJob (render + create/adopt children)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ERRORS = Counter("llmtrain_errors_total", "Reconcile and status errors by reason", ["reason"])


class PhaseBook:
    """Current phase per job, so the gauge counts jobs rather than transitions.

    Two sources, each job counted once (the live one wins): `set` books a job Kopf sees or the
    operator reports on; a finished job, labelled so, leaves Kopf's view (`retain` moves it aside
    when that DELETED event comes) and the resync pass counts the finished jobs as they are stored
    (`count_retained`), so a finished job deleted meanwhile leaves the gauge within a pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[str, str] = {}
        self._retained: dict[str, str] = {}

    def start(self) -> None:
        """This process acts from now on: every phase is reported, at zero until a job has it."""
        with self._lock:
            self._publish()

    def set(self, key: str, phase: str) -> None:
        with self._lock:
            self._phases[key] = phase
            self._publish()

    def retain(self, key: str, phase: str) -> None:
        """A job still stored, out of Kopf's view (labelled finished): counted as retained."""
        with self._lock:
            self._phases.pop(key, None)
            self._retained[key] = phase
            self._publish()

    def count_retained(self, phases: dict[str, str]) -> None:
        """The finished jobs the resync found labelled, by key: they replace the last count, and a
        finished job booked live (its leaving event missed) is moved among them."""
        with self._lock:
            self._retained = dict(phases)
            for key in phases:
                if self._phases.get(key) in TERMINAL_PHASES:
                    del self._phases[key]
            self._publish()

    def forget(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._phases.pop(key, None)
                self._retained.pop(key, None)
            self._publish()

    def keys(self) -> frozenset[str]:
        """Every job booked, live or retained."""
        with self._lock:
            return frozenset(self._phases) | frozenset(self._retained)

    def _publish(self) -> None:
        counts: dict[str, int] = dict.fromkeys(PHASES, 0)
        for phase in {**self._retained, **self._phases}.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in counts.items():
            JOBS.labels(phase=phase).set(count)


PHASE_BOOK = PhaseBook()


class ResyncStats:
    """The resync loop's health: when a pass last succeeded, how long the last one took, and passes
    by result. Nothing is exported before the first pass (a standby runs none)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passes = {"success": 0, "failure": 0}
        self._last_success: float | None = None
        self._last_duration: float | None = None

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Time one pass; an exception counts it as failed and goes on to the caller."""
        started, clock = time.time(), time.monotonic()
        result = "failure"
        try:
            yield
            result = "success"
        finally:
            with self._lock:
                self._passes[result] += 1
                self._last_duration = time.monotonic() - clock
                if result == "success":
                    self._last_success = started

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            if self._last_duration is None:
                return []
            passes = CounterMetricFamily(
                "llmtrain_resync_passes", "Resync passes over every job, by result", labels=["result"]
            )
            for result, count in self._passes.items():
                passes.add_metric([result], count)
            out: list[Metric] = [
                passes,
                GaugeMetricFamily(
                    "llmtrain_resync_last_duration_seconds",
                    "How long the last resync pass took",
                    self._last_duration,
                ),
            ]
            if self._last_success is not None:
                out.append(
                    GaugeMetricFamily(
                        "llmtrain_resync_last_success_timestamp_seconds",
                        "When the last successful resync pass started (Unix time)",
                        self._last_success,
                    )
                )
            return out


RESYNC = ResyncStats()
REGISTRY.register(RESYNC)
