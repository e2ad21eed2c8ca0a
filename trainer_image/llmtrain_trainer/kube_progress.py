"""Rank 0 → `LLMTrainingJob.status.progress`, through the status subresource.

Training must never wait on the API server: `emit()` only records the newest state and wakes a
background thread, which patches at most every `interval` seconds (immediately on a checkpoint, the
end, or an error). A failed patch is retried with backoff; a state that a newer one replaced while
waiting is dropped, never sent late. The pod's own ServiceAccount may patch only this job's status
(the namespace's reporter Role, narrowed to the job by the chart's reporter admission policy), so
this needs no client library: the standard library suffices.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmtrain.api.status import ERROR_MAX_LENGTH, NOTICE_MAX_LENGTH, NOTICES_MAX, CheckpointRef, Progress
from llmtrain.constants import GROUP_VERSION, PLURAL, PROGRESS_INTERVAL_SECONDS, RFC3339_FORMAT

from llmtrain_trainer.metrics import MetricsRecord

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

log = logging.getLogger(__name__)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Outside a pod (tests, development), point the reporter at an API server explicitly: its URL, a
# bearer token, and the CA bundle that signed its serving certificate (else the system's CAs).
API_SERVER_ENV = "LLMTRAIN_API_SERVER"
API_TOKEN_ENV = "LLMTRAIN_API_TOKEN"
API_CA_FILE_ENV = "LLMTRAIN_API_CA_FILE"
_URGENT = {"checkpoint", "finished", "exported"}


@dataclass(frozen=True)
class ApiTarget:
    base_url: str
    token: str | None
    ca_file: str | None

    @classmethod
    def discover(cls) -> ApiTarget | None:
        """$LLMTRAIN_API_SERVER (with $LLMTRAIN_API_TOKEN and $LLMTRAIN_API_CA_FILE) if set; else, in
        a pod, the in-cluster address, ServiceAccount token and CA."""
        explicit = os.environ.get(API_SERVER_ENV)
        if explicit:
            return cls(
                explicit.rstrip("/"), os.environ.get(API_TOKEN_ENV), os.environ.get(API_CA_FILE_ENV) or None
            )
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        token_file = SA_DIR / "token"
        if not host or not port or not token_file.exists():
            return None
        ca = SA_DIR / "ca.crt"
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", token_file.read_text().strip(), str(ca) if ca.exists() else None)

    def status_url(self, namespace: str, name: str) -> str:
        return f"{self.base_url}/apis/{GROUP_VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime(RFC3339_FORMAT)


def progress_fields(state: dict[str, Any], record: MetricsRecord) -> dict[str, Any]:
    """Fold one record into the progress block: the CRD's status.progress, built with its model
    (`llmtrain.api.status.Progress`), so the operator's schema and this writer cannot drift."""
    changes: dict[str, Any] = {
        "step": record.step,
        "total_steps": record.total_steps,
        "summary": f"{record.step}/{record.total_steps}",
        "updated_at": _rfc3339(record.time),
    }
    reported = list(state.get("notices") or [])
    notices = reported
    for name in ("epoch", "loss", "learning_rate", "tokens_per_second", "mfu"):
        value = getattr(record, name)
        if value is None:
            continue
        if not math.isfinite(value):
            # JSON has no NaN or infinity: the API server refuses a patch holding one, and the
            # state would carry it into every later patch, so progress would stop for the rest of
            # the run. The figure stays as last reported; a diverged loss is said in a notice.
            if name == "loss" and not any(n.startswith(DIVERGED) for n in notices):
                notices = _add_notice(notices, f"{DIVERGED} ({value}) at step {record.step}: {DIVERGED_FIX}")
            continue
        changes[name] = round(float(value), 6)
    if record.eta_seconds is not None:
        changes["eta_seconds"] = max(0, int(record.eta_seconds))
    if record.event == "checkpoint" and record.path:
        seconds = record.checkpoint_seconds
        changes["last_checkpoint"] = (
            CheckpointRef(path=record.path, step=record.step)
            if seconds is None
            else CheckpointRef(path=record.path, step=record.step, seconds=round(seconds, 3))
        )
    if record.event == "validation" and record.val_loss is not None and math.isfinite(record.val_loss):
        changes.update(eval_fields(state, record))
    if record.event == "finished":
        changes["eta_seconds"] = 0
    if record.event == "notice" and record.message:
        notices = _add_notice(notices, record.message)
    if notices != reported:
        changes["notices"] = notices
    return Progress.model_validate(state).model_copy(update=changes).to_patch()


# The notice of a training loss that is NaN or infinite, said once per run.
DIVERGED = "the training loss is not finite"
DIVERGED_FIX = (
    "training has diverged; lower training.learningRate or set training.maxGradNorm, and resume "
    "from a checkpoint before it (spec.resumeFrom)"
)


def _add_notice(notices: list[str], text: str) -> list[str]:
    """`notices` with `text` (cut to the CRD's bound) at the end, unless it is there already; the
    oldest go past NOTICES_MAX."""
    notice = text[:NOTICE_MAX_LENGTH]
    return notices if notice in notices else [*notices, notice][-NOTICES_MAX:]


def eval_fields(state: dict[str, Any], record: MetricsRecord) -> dict[str, Any]:
    """evalLoss/evalStep, and bestEvalLoss/bestStep: the trainer's own best when the record carries
    it (the builtin loop's, minDelta-aware and restored on resume), else the lowest seen here."""
    assert record.val_loss is not None
    loss = round(float(record.val_loss), 6)
    changes: dict[str, Any] = {"eval_loss": loss, "eval_step": record.step}
    if record.best_val_loss is not None and record.best_step is not None:
        changes["best_eval_loss"] = round(float(record.best_val_loss), 6)
        changes["best_step"] = record.best_step
    else:
        best = state.get("bestEvalLoss")
        if best is None or loss < float(best):
            changes["best_eval_loss"], changes["best_step"] = loss, record.step
    return changes


class KubernetesProgressSink:
    """A ProgressSink that patches the job's status.progress from a background thread."""

    def __init__(
        self,
        target: ApiTarget,
        namespace: str,
        name: str,
        interval: float = PROGRESS_INTERVAL_SECONDS,
        timeout: float = 10.0,
        max_backoff: float = 60.0,
    ) -> None:
        self._url = target.status_url(namespace, name)
        self._target = target
        self._interval = interval
        self._timeout = timeout
        self._max_backoff = max_backoff
        self._state: dict[str, Any] = {}
        self._version = 0  # bumped on every emit; the sender only sends the newest
        self._sent_version = 0
        self._urgent = False
        self._cond = threading.Condition()
        self._closing = False
        self.patches_sent = 0
        self.failures = 0
        self._ssl = (
            ssl.create_default_context(cafile=target.ca_file) if target.base_url.startswith("https") else None
        )
        self._thread = threading.Thread(target=self._run, name="llmtrain-progress", daemon=True)
        self._thread.start()

    def emit(self, record: MetricsRecord) -> None:
        with self._cond:
            self._state = progress_fields(self._state, record)
            self._version += 1
            self._urgent = self._urgent or record.event in _URGENT
            self._cond.notify()

    def report_error(self, message: str | None) -> None:
        """The root cause of a failed run (e.g. 'OutOfMemoryError on rank 3: ...') or of a stall,
        sent at once; None clears it (a merge patch deletes a null field)."""
        self.report(error=None if message is None else message[:ERROR_MAX_LENGTH])

    def report(self, **fields: Any) -> None:
        """Set status.progress fields (Progress's names) at once, e.g. exported_to."""
        with self._cond:
            changes = {**fields, "updated_at": _rfc3339(time.time())}
            self._state = Progress.model_validate(self._state).model_copy(update=changes).to_patch()
            self._version += 1
            self._urgent = True
            self._cond.notify()

    def close(self, flush_timeout: float = 10.0) -> None:
        """Send what is pending (bounded), then stop. Never blocks longer than flush_timeout."""
        with self._cond:
            self._closing = True
            self._urgent = True
            self._cond.notify()
        self._thread.join(flush_timeout)

    def _run(self) -> None:
        last_sent = 0.0
        backoff = 1.0
        while True:
            with self._cond:
                while True:
                    pending = self._version != self._sent_version
                    due = time.monotonic() - last_sent >= self._interval
                    if pending and (self._urgent or due):
                        break
                    if self._closing and not pending:
                        return
                    wait = None if not pending else max(0.0, self._interval - (time.monotonic() - last_sent))
                    self._cond.wait(wait)
                version, state = self._version, dict(self._state)
                self._urgent = False
            if self._patch(state):
                last_sent = time.monotonic()
                backoff = 1.0
                with self._cond:
                    self._sent_version = max(self._sent_version, version)
            else:
                with self._cond:
                    if self._closing:
                        return  # the run is over; do not hold the process on a broken API
                    # Retry later; if newer state arrives meanwhile, it replaces this one.
                    self._urgent = False
                    self._cond.wait(backoff)
                    self._urgent = True
                backoff = min(backoff * 2, self._max_backoff)

    def _patch(self, progress: dict[str, Any]) -> bool:
        body = json.dumps({"status": {"progress": progress}}).encode()
        request = urllib.request.Request(self._url, data=body, method="PATCH")
        request.add_header("Content-Type", "application/merge-patch+json")
        request.add_header("Accept", "application/json")
        if self._target.token:
            request.add_header("Authorization", f"Bearer {self._target.token}")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._ssl) as resp:
                resp.read()
            self.patches_sent += 1
            return True
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failures += 1
            log.warning("progress report failed (will retry): %s", exc)
            return False


def kubernetes_sink(config: TrainerConfig) -> KubernetesProgressSink | None:
    """The sink for this job's status, or None outside a cluster (then the log lines suffice)."""
    target = ApiTarget.discover()
    if target is None:
        log.info("progress reporting to Kubernetes is off: no in-cluster credentials")
        return None
    return KubernetesProgressSink(
        target, config.job.namespace, config.job.name, interval=config.progress.interval_seconds
    )


def report_failure(config: TrainerConfig, root_cause: str, flush_timeout: float = 10.0) -> None:
    """From the driver: put the failed run's root cause into status.progress.error (bounded wait)."""
    if not config.progress.report_to_kubernetes:
        return
    sink = kubernetes_sink(config)
    if sink is not None:
        sink.report_error(root_cause)
        sink.close(flush_timeout)


def report_export(
    config: TrainerConfig,
    uri: str | None = None,
    hub_commit: str | None = None,
    flush_timeout: float = 10.0,
) -> None:
    """From the driver: where the export went, in status.progress.exportedTo (the object-store
    URI) and status.progress.pushedToHub (the Hub commit's URL); a None leaves its field alone."""
    if not config.progress.report_to_kubernetes:
        return
    fields = {k: v for k, v in {"exported_to": uri, "pushed_to_hub": hub_commit}.items() if v is not None}
    if not fields:
        return
    sink = kubernetes_sink(config)
    if sink is not None:
        sink.report(**fields)
        sink.close(flush_timeout)
