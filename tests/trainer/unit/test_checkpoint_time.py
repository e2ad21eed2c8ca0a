"""Checkpoint time is reported and counted in the ETA: the record, status.progress, the log line
and the progress bar carry it, and eta_seconds adds it for every checkpoint still to come."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from llmtrain.api.status import Progress
from llmtrain_trainer.kube_progress import progress_fields
from llmtrain_trainer.metrics import MetricsRecord, checkpoints_from, eta_seconds
from llmtrain_trainer.progress import format_record
from llmtrain_trainer.progress_bar import ConsoleProgress
from rich.console import Console


@pytest.mark.parametrize(
    ("step", "total", "every", "at_end", "expected"),
    [
        (1, 30, 10, True, 3),  # 10, 20, 30
        (10, 30, 10, True, 3),  # step 10's own checkpoint is still to come when it logs
        (11, 30, 10, True, 2),
        (31, 30, 10, True, 0),
        (1, 25, 10, True, 3),  # 10, 20 and the end's 25
        (1, 25, 10, False, 2),
        (21, 25, 10, True, 1),
        (25, 25, 10, False, 0),
    ],
)
def test_checkpoints_left_follow_the_grid_and_the_end(
    step: int, total: int, every: int, at_end: bool, expected: int
) -> None:
    assert checkpoints_from(step, total, every, at_end) == expected


def test_eta_counts_the_checkpoints_still_to_write() -> None:
    assert eta_seconds(100, 0.5, checkpoints_left=3, checkpoint_seconds=20.0) == pytest.approx(110.0)
    assert eta_seconds(100, 0.5) == pytest.approx(50.0)  # before the first checkpoint: unknown, 0


def test_status_progress_shows_how_long_the_last_checkpoint_took() -> None:
    record = MetricsRecord(
        "checkpoint", 40, 120, path="/runs/x/checkpoint-step-00000040", checkpoint_seconds=12.3456
    )
    progress = progress_fields({}, record)
    assert progress["lastCheckpoint"] == {
        "path": "/runs/x/checkpoint-step-00000040",
        "step": 40,
        "seconds": 12.346,
    }
    # The CRD's status schema (generated from this model) keeps the field.
    assert Progress.model_validate(progress).last_checkpoint.seconds == pytest.approx(12.346)  # type: ignore[union-attr]


def test_log_line_and_progress_bar_show_the_checkpoint_time(tmp_path: Path) -> None:
    record = MetricsRecord("checkpoint", 40, 120, path="/ckpt", checkpoint_seconds=7.25)
    assert format_record(record) == "[checkpoint] step 40/120 /ckpt (7.2 s)"
    metrics = tmp_path / "metrics.jsonl"
    progress = ConsoleProgress(metrics)
    progress.console = Console(file=(shown := io.StringIO()), width=400)
    metrics.write_text(json.dumps(record.to_dict()) + "\n")
    with progress:
        pass
    assert "checkpoint at step 40 (7.2 s): /ckpt" in shown.getvalue()
