"""The layout of a run directory (`<storage_path>/<run_name>/`), without heavy imports.

checkpoint-step-00000040/   sharded checkpoints Ray Train knows about (NO_UPLOAD reports)
checkpoint_manager_snapshot.json   Ray Train's record of them (what a restart resumes from)
metrics.jsonl               rank 0's progress records, appended across attempts
result.json                 written by rank 0 when the run has finished
export/                     the Hugging Face export (never a reported checkpoint)
summary.json, loss_curve.png   written by `llmtrain run`

The export directory's name is shared with the renderer: llmtrain.constants.EXPORT_DIR.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

CHECKPOINT_PREFIX = "checkpoint-step-"
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.json"
LOSS_CURVE_FILE = "loss_curve.png"


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories whose state file was written (the last file of a save), newest first."""
    return sorted(
        (p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if (p / STATE_FILE).exists()), reverse=True
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory on disk (for messages; Ray decides what resumes)."""
    complete = complete_checkpoints(run_dir)
    return complete[0] if complete else None


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
