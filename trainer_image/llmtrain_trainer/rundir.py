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

from pathlib import Path

CHECKPOINT_PREFIX = "checkpoint-step-"
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.json"
LOSS_CURVE_FILE = "loss_curve.png"


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory on disk (for messages; Ray decides what resumes)."""
    complete = sorted(p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if (p / STATE_FILE).exists())
    return complete[-1] if complete else None
