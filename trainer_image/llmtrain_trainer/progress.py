"""Where rank 0's progress goes: the `ProgressSink` protocol and the sinks shipped here.

Rank 0 hands every `MetricsRecord` to each sink. `JsonlSink` appends it to `metrics.jsonl` in the
run directory (the loss curve, the local progress bar and `summary.json` are all read from there,
since Ray Train keeps no metrics reported without a checkpoint); `LogSink` prints a line for the
pod log. A Kubernetes sink (patching LLMTrainingJob.status.progress) plugs in through
`open_sinks` when `progress.reportToKubernetes` is set.

`ConsoleProgress` is the local reporter: it runs in the `llmtrain run` driver and follows
`metrics.jsonl` to draw a live progress bar.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

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


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


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


class ConsoleProgress:
    """A rich progress bar in the local driver, fed by following `metrics.jsonl`."""

    def __init__(self, path: Path, poll_seconds: float = 0.25) -> None:
        from rich.console import Console

        self.path = path
        self.poll_seconds = poll_seconds
        self.console = Console()
        self._offset = path.stat().st_size if path.exists() else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="llmtrain-progress", daemon=True)

    def __enter__(self) -> ConsoleProgress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=None, stats="starting Ray workers…")
        self._progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()
        self._progress.stop()

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self._drain()

    def _drain(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("r", encoding="utf-8") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete, _, _ = chunk.rpartition("\n")
        if not complete:
            return
        self._offset += len(complete.encode("utf-8")) + 1
        for line in complete.splitlines():
            try:
                self.show(MetricsRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError):
                continue

    def show(self, record: MetricsRecord) -> None:
        progress, task = self._progress, self._task
        if record.event == "step":
            stats = f"loss {record.loss:.4f}"
            if record.tokens_per_second:
                stats += f" · {record.tokens_per_second:,.0f} tok/s"
            if record.eta_seconds is not None:
                stats += f" · ETA {format_duration(record.eta_seconds)}"
            progress.update(task, total=record.total_steps, completed=record.step, stats=stats)
        elif record.event == "resumed":
            progress.console.print(f"[yellow]Resumed from the checkpoint at step {record.step}[/yellow]")
            progress.update(task, total=record.total_steps, completed=record.step)
        elif record.event == "started":
            progress.update(task, total=record.total_steps, completed=record.step, stats="training…")
        elif record.event == "checkpoint":
            progress.console.print(f"[dim]checkpoint at step {record.step}: {record.path}[/dim]")
        elif record.event == "validation":
            progress.console.print(f"validation loss at step {record.step}: {record.val_loss:.4f}")
        elif record.event == "exported":
            progress.console.print(f"[green]exported[/green] {record.path}")
