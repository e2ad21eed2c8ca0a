"""What a worker asks of whatever launched it: the run's latest checkpoint and where to report one.

Inside Ray Train (`RayRunContext`), Ray's controller owns that bookkeeping: it names the checkpoint
a restarted attempt resumes from and retires old ones per `num_to_keep`. A one-process or torchrun
launch (launch.py, on a machine without Ray) uses `LocalRunContext`, which reads the same facts off
the run directory: the latest checkpoint is the newest complete one, and a report keeps the newest
`checkpoint.keep` complete ones, so both launches leave the same files behind. Ray is imported only
by the Ray implementation, so the local launch never imports it.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist

from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.rundir import complete_checkpoints

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

log = logging.getLogger(__name__)


class RunContext(Protocol):
    """The launcher's side of checkpointing, as the lifecycle and the checkpoint code use it."""

    def latest_checkpoint(self, run_dir: Path) -> Path | None:
        """The checkpoint this attempt resumes from (this run's own), or None on a fresh run."""

    def report_checkpoint(self, directory: Path, metrics: dict[str, Any], env: WorkerEnv) -> None:
        """Register a complete checkpoint (a collective: every rank calls it)."""


class RayRunContext:
    """Ray Train's context: checkpoints are reported with NO_UPLOAD (they already lie on the shared
    storage), so Ray only records the path and deletes old ones per `num_to_keep`."""

    def latest_checkpoint(self, run_dir: Path) -> Path | None:
        import ray.train

        reported = ray.train.get_checkpoint()
        # Reported with NO_UPLOAD: the directory lies in the run directory itself.
        return None if reported is None else run_dir / Path(reported.path).name

    def report_checkpoint(self, directory: Path, metrics: dict[str, Any], env: WorkerEnv) -> None:
        """`ray.train.report` returns once the checkpoint is queued; rank 0 then waits until the
        controller has committed it (written its snapshot), so a "checkpoint" progress record means
        a restart from this point is guaranteed, even if the driver dies the next moment."""
        import ray.train
        from ray.train import CheckpointConsistencyMode, CheckpointUploadMode

        storage = ray.train.get_context().get_storage()
        checkpoint = ray.train.Checkpoint(str(directory), filesystem=storage.storage_filesystem)
        ray.train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_dir_name=directory.name,
            checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        )
        if env.is_main:
            ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)

    @staticmethod
    def run_dir() -> Path:
        """The run directory Ray Train's storage names (`<storage_path>/<run_name>`)."""
        import ray.train

        return Path(ray.train.get_context().get_storage().experiment_fs_path)


SCORE_FILE = "val_loss.json"
"""A checkpoint's validation loss, written by the launch without Ray when checkpoints are ranked by
it (checkpoint.keepBest/exportBest): Ray's controller keeps that score in its own records."""


def ranks_by_val_loss(config: TrainerConfig) -> bool:
    """checkpoint.keepBest/exportBest in the builtin loop, whose every checkpoint carries a
    val_loss; the huggingface trainer keeps its best through load_best_model_at_end instead."""
    return config.trainer.type == "builtin" and (config.checkpoint.keep_best or config.checkpoint.export_best)


class LocalRunContext:
    """A launch without Ray: the run directory is the only record, as it is for `llmtrain run`'s
    messages. `keep` is checkpoint.keep, Ray's `num_to_keep` in the Ray launch; `by_val_loss`
    keeps the `keep` lowest validation losses and the latest instead of the newest, as Ray's
    `checkpoint_score_attribute` does (`ranks_by_val_loss`)."""

    def __init__(self, keep: int, by_val_loss: bool = False) -> None:
        self.keep = keep
        self.by_val_loss = by_val_loss

    def latest_checkpoint(self, run_dir: Path) -> Path | None:
        """The newest complete checkpoint; a torn one (no state file) never counts, and one that
        is complete but unreadable makes restore fall back to the older ones."""
        complete = complete_checkpoints(run_dir)
        return complete[0] if complete else None

    def report_checkpoint(self, directory: Path, metrics: dict[str, Any], env: WorkerEnv) -> None:
        """Once every rank is here (all files written, the state file too), rank 0 deletes the
        complete checkpoints older than the newest `keep`."""
        dist.barrier()
        if not env.is_main:
            return
        if self.by_val_loss:
            (directory / SCORE_FILE).write_text(json.dumps({"val_loss": metrics.get("val_loss", math.inf)}))
        complete = complete_checkpoints(directory.parent)
        kept = self._kept(complete)
        for old in complete:
            if old not in kept:
                log.info("removing %s (checkpoint.keep is %d)", old.name, self.keep)
                shutil.rmtree(old, ignore_errors=True)

    def _kept(self, complete: list[Path]) -> set[Path]:
        """Newest first in `complete`: the newest `keep`, or the latest and the `keep` best."""
        if not self.by_val_loss:
            return set(complete[: self.keep])
        return {*complete[:1], *sorted(complete, key=_val_loss)[: self.keep]}


def _val_loss(checkpoint: Path) -> float:
    """A checkpoint's recorded validation loss; one without a record ranks last."""
    try:
        return float(json.loads((checkpoint / SCORE_FILE).read_text())["val_loss"])
    except (OSError, ValueError, KeyError, TypeError):
        return math.inf
