"""Prometheus metrics of the operator (served on --metrics-port)."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

from llmtrain.api.status import PHASES

JOBS = Gauge("llmtrain_jobs", "LLMTrainingJobs by phase, as last written by this operator", ["phase"])
RECONCILE_SECONDS = Histogram(
    "llmtrain_reconcile_duration_seconds",
    "Time to reconcile one LLMTrainingJob (render + create/adopt children)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ERRORS = Counter("llmtrain_errors_total", "Reconcile and status errors by reason", ["reason"])


class PhaseBook:
    """Current phase per job, so the gauge counts jobs rather than transitions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[str, str] = {}
        for phase in PHASES:
            JOBS.labels(phase=phase).set(0)

    def set(self, key: str, phase: str) -> None:
        with self._lock:
            self._phases[key] = phase
            self._publish()

    def forget(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._phases.pop(key, None)
            self._publish()

    def keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._phases)

    def _publish(self) -> None:
        counts: dict[str, int] = dict.fromkeys(PHASES, 0)
        for phase in self._phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in counts.items():
            JOBS.labels(phase=phase).set(count)


PHASE_BOOK = PhaseBook()
