"""`llmtrain run`'s live progress bar: the laptop side of progress, not the workers'.

`ConsoleProgress` runs in the local driver and follows the `metrics.jsonl` that rank 0's
`JsonlSink` (progress.py) appends to; rich is imported only when a bar is made.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from llmtrain.jobs_view import format_duration

from llmtrain_trainer.metrics import MetricsRecord


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
        from rich.markup import escape  # paths and messages are shown as they are, never as markup

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
            took = "" if record.checkpoint_seconds is None else f" ({record.checkpoint_seconds:.1f} s)"
            progress.console.print(
                f"[dim]checkpoint at step {record.step}{took}: {escape(str(record.path))}[/dim]"
            )
        elif record.event == "validation":
            progress.console.print(f"validation loss at step {record.step}: {record.val_loss:.4f}")
        elif record.event == "exported":
            progress.console.print(f"[green]exported[/green] {escape(str(record.path))}")
