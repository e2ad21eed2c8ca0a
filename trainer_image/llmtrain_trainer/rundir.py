"""The layout of a run directory (`<storage_path>/<run_name>/`), without heavy imports.

checkpoint-step-00000040/   sharded checkpoints Ray Train knows about (NO_UPLOAD reports)
checkpoint-step-00000040-1/ step 40 saved again (after falling back past a corrupt checkpoint, or
                            over an attempt's unreported leftover): a path is never reported twice
checkpoint_manager_snapshot.json   Ray Train's record of them (what a restart resumes from)
metrics.jsonl               rank 0's progress records, appended across attempts
result.json                 `RunResult`, written by rank 0 when the run has finished (lifecycle.py)
export/                     the Hugging Face export (never a reported checkpoint)
logs/driver.log, logs/worker-N.log   the driver's and each rank's log lines, appended across
                            attempts (run_logs.py; `llmtrain logs NAME --saved` reads them)
.watchdog/rank-N.json       each rank's step and phase, for naming a stuck rank (watchdog.py)
summary.json, loss_curve.png   written by `llmtrain run`

The export directory's name is shared with the renderer: llmtrain.constants.EXPORT_DIR.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO

CHECKPOINT_PREFIX = "checkpoint-step-"
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.json"
LOSS_CURVE_FILE = "loss_curve.png"


def checkpoint_name(step: int, copy: int = 0) -> str:
    """`checkpoint-step-N`, or `checkpoint-step-N-K` for the K-th later save of the same step."""
    name = f"{CHECKPOINT_PREFIX}{step:08d}"
    return f"{name}-{copy}" if copy else name


def checkpoint_order(path: Path) -> tuple[int, int]:
    """(step, copy) of a checkpoint directory: a later save of a step sorts after the earlier ones
    (names alone would put `-10` before `-9`); an unparsable name sorts first."""
    step, _, copy = path.name.removeprefix(CHECKPOINT_PREFIX).partition("-")
    try:
        return int(step), int(copy or 0)
    except ValueError:
        return -1, -1


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories whose state file was written (the last file of a save), newest first."""
    return sorted(
        (p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if (p / STATE_FILE).exists()),
        key=checkpoint_order,
        reverse=True,
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory on disk (for messages; Ray decides what resumes)."""
    complete = complete_checkpoints(run_dir)
    return complete[0] if complete else None


@dataclass(frozen=True)
class RunResult:
    """`result.json`: what a finished run leaves (read by `llmtrain run` and the tests)."""

    steps: int
    trainer: str = "builtin"
    finished: bool = True
    resumed_from_step: int | None = None
    """The step the last attempt started from, None on a fresh start (or a weights-only seed)."""
    resume_from: str | None = None
    """spec.resumeFrom's target, when the run started from it."""
    skipped_checkpoints: tuple[str, ...] = ()
    """Newer checkpoints that could not be restored, with the reasons."""
    checkpoint: str | None = None
    export: str | None = None
    world_size: int = 1
    train_seconds: float | None = None
    """Seconds spent stepping in the last attempt (checkpoints and evaluations excluded)."""
    tokens_per_second: float | None = None
    best_checkpoint: str | None = None
    """The checkpoint with the lowest validation loss (the exported one with checkpoint.exportBest)."""
    best_val_loss: float | None = None
    stopped_early: str | None = None
    """Why training.earlyStopping ended the run before its last step."""
    finished_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["skipped_checkpoints"] = list(self.skipped_checkpoints)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["skipped_checkpoints"] = tuple(values.get("skipped_checkpoints") or ())
        return cls(**values)

    @classmethod
    def read(cls, run_dir: Path) -> RunResult | None:
        """The run's result, or None when it has not finished (or the file is torn)."""
        path = run_dir / RESULT_FILE
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def write(self, run_dir: Path) -> None:
        (run_dir / RESULT_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def write_durably(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a file under a temporary name, fsync it, then rename it into place.

    A crash (or a node losing power) leaves the old file or none, never a torn one; a checkpoint's
    state file, written last, then really means that everything before it reached the disk.
    """
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    # The rename itself is durable once the directory is synced; some network filesystems refuse
    # to fsync a directory, and there the rename is as durable as the server makes it.
    with contextlib.suppress(OSError):
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
