"""Where rank 0's progress goes: the `ProgressSink` protocol and the sinks shipped here.

Rank 0 hands every `MetricsRecord` to each sink. `JsonlSink` appends it to `metrics.jsonl` in the
run directory (the loss curve, the local progress bar and `summary.json` are all read from there,
since Ray Train keeps no metrics reported without a checkpoint); `LogSink` prints a line for the
pod log. A Kubernetes sink (patching LLMTrainingJob.status.progress) plugs in through
`open_sinks` when `progress.reportToKubernetes` is set, and spec.tracking's MLflow, W&B and
TensorBoard sinks (tracking.py) when it is set. `read_records` and `step_history` read the
file back; `llmtrain run`'s progress bar (progress_bar.py) follows it as it grows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from llmtrain.jobs_view import format_duration  # one clock format for the local bar and `llmtrain watch`

from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.rundir import METRICS_FILE

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

log = logging.getLogger(__name__)


@runtime_checkable
class ProgressSink(Protocol):
    """Receives rank 0's records; must be cheap (it runs between training steps) and not raise."""

    def emit(self, record: MetricsRecord) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per record; a resumed run appends to the same file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def emit(self, record: MetricsRecord) -> None:
        self._file.write(json.dumps(record.to_dict()) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class LogSink:
    """One human-readable log line per record (what `kubectl logs` and Ray's job logs show)."""

    def emit(self, record: MetricsRecord) -> None:
        log.info("%s", format_record(record))

    def close(self) -> None:
        pass


def format_record(record: MetricsRecord) -> str:
    if record.event != "step":
        details = record.message or record.path or ""
        if record.checkpoint_seconds is not None:
            details += f" ({record.checkpoint_seconds:.1f} s)"
        return f"[{record.event}] step {record.step}/{record.total_steps} {details}".rstrip()
    parts = [f"step {record.step}/{record.total_steps}", f"loss {record.loss:.4f}"]
    if record.learning_rate is not None:
        parts.append(f"lr {record.learning_rate:.2e}")
    if record.grad_norm is not None:
        parts.append(f"grad_norm {record.grad_norm:.3f}")
    if record.tokens_per_second is not None:
        parts.append(f"tokens/s {record.tokens_per_second:,.0f}")
    if record.mfu is not None:
        parts.append(f"mfu {record.mfu:.1%}")
    if record.eta_seconds is not None:
        parts.append(f"eta {format_duration(record.eta_seconds)}")
    return " | ".join(parts)


class FanOut:
    """All sinks as one; a failing sink is logged and dropped rather than stopping training."""

    def __init__(self, sinks: Iterable[ProgressSink]) -> None:
        self.sinks = list(sinks)

    def emit(self, record: MetricsRecord) -> None:
        for sink in list(self.sinks):
            try:
                sink.emit(record)
            except Exception:
                log.exception("progress sink %s failed; disabling it", type(sink).__name__)
                self.sinks.remove(sink)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.exception("closing progress sink %s failed", type(sink).__name__)


def open_sinks(config: TrainerConfig, run_dir: Path, log_lines: bool) -> FanOut:
    """The sinks rank 0 writes to for this run."""
    sinks: list[ProgressSink] = [JsonlSink(run_dir / METRICS_FILE)]
    if log_lines:
        sinks.append(LogSink())
    if config.progress.report_to_kubernetes:
        from llmtrain_trainer.kube_progress import kubernetes_sink

        sink = kubernetes_sink(config)
        if sink is not None:
            sinks.append(sink)
    if config.tracking is not None:
        from llmtrain_trainer.tracking import tracking_sinks

        sinks.extend(tracking_sinks(config, run_dir))
    return FanOut(sinks)


def read_records(path: Path) -> list[MetricsRecord]:
    """Every record in a metrics file; a torn last line (a killed writer) is skipped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(MetricsRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return records


def step_history(records: Iterable[MetricsRecord]) -> list[MetricsRecord]:
    """One step record per step, the latest attempt winning (a resume repeats steps after its checkpoint)."""
    by_step: dict[int, MetricsRecord] = {}
    for record in records:
        if record.event == "step":
            by_step[record.step] = record
    return [by_step[step] for step in sorted(by_step)]
