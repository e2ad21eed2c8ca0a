"""trainer.type custom: the user's function runs on every worker with a `TrainContext`.

The function owns the model, optimizer, data and step loop. The platform owns the rest: it starts
the workers (process group set up, device chosen), tells the function where to resume from, and
turns its `report` and `save_checkpoint` calls into the same progress records, Ray Train
checkpoints and job status as the built-in loop. A checkpoint is registered only once every rank
has written its part, so a worker failure restarts all workers from a complete one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from llmtrain.api.trainer_config import TrainerConfig

from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.lifecycle import Lifecycle
from llmtrain_trainer.modes.reference import resolve

log = logging.getLogger(__name__)

STATE_FILE_NAME = "state.pt"
REPORTABLE = ("learning_rate", "grad_norm", "tokens_per_second", "epoch", "tokens_seen", "val_loss")


@dataclass
class TrainContext:
    """What a custom training function gets. Every rank gets its own; `save_checkpoint` and
    `checkpoint_dir` are collectives (all ranks call them for the same steps), `report` is not
    (call it on any rank; only rank 0's calls are recorded)."""

    config: TrainerConfig
    """The resolved spec: model, dataset, training, checkpoint... as rendered for this run."""
    args: dict[str, Any]
    """trainer.custom.args, as written in the spec."""
    run_dir: Path
    """This run's directory on the shared storage (checkpoints, metrics.jsonl, result.json)."""
    export_dir: Path
    """Where to save the final model (e.g. `save_pretrained`) if you export one."""
    resume_checkpoint: Path | None
    """The latest complete checkpoint directory to continue from, or None on a fresh start."""
    resume_step: int | None
    """The step that checkpoint was saved at, or None."""
    seed_checkpoint: Path | None
    """spec.resumeFrom.checkpoint on a run's first attempt: a checkpoint directory whose weights to
    start from (with a fresh optimizer, at step 0), or None. resumeFrom.run sets resume_checkpoint."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    total_steps: int
    """training.maxSteps (0 when unset); set it if you compute the length yourself, for the ETA and
    the progress summary."""
    _run: Lifecycle = field(repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def report(self, step: int, loss: float | None = None, **metrics: float) -> None:
        """Record progress at `step` (loss and any of REPORTABLE) for the log, metrics.jsonl and
        the job's status.progress. With `tokens_seen` (all ranks' tokens so far) the platform
        measures tokens/s between reports, unless `tokens_per_second` is given."""
        unknown = sorted(set(metrics) - set(REPORTABLE))
        if unknown:
            raise TypeError(f"report() got unknown metrics {unknown}; known: {list(REPORTABLE)}")
        self._run.total_steps = self.total_steps
        self._run.step(step, None if loss is None else float(loss), **metrics)

    @contextmanager
    def checkpoint_dir(self, step: int, **metrics: float) -> Iterator[Path]:
        """An empty `checkpoint-step-N/` for every rank to write its files into (sharded state);
        registered as the run's latest checkpoint when every rank has left the block."""
        self._run.total_steps = self.total_steps
        with self._run.checkpoint_dir(step, dict(metrics)) as directory:
            yield directory

    def save_checkpoint(self, step: int, state: Any, **metrics: float) -> Path:
        """Save `state` (anything `torch.save` takes, e.g. model and optimizer state dicts of a
        replicated model) from rank 0 as the checkpoint of `step`; every rank calls it."""
        with self.checkpoint_dir(step, **metrics) as directory:
            if self.is_main:
                torch.save(state, directory / STATE_FILE_NAME)
        return directory

    def load_checkpoint(self, map_location: str | torch.device = "cpu") -> Any | None:
        """What `save_checkpoint` saved in the resume checkpoint, or None on a fresh start."""
        return _load_state(self.resume_checkpoint, map_location)

    def load_seed(self, map_location: str | torch.device = "cpu") -> Any | None:
        """What `save_checkpoint` saved in the seed checkpoint (take its weights), or None."""
        return _load_state(self.seed_checkpoint, map_location)


def _load_state(directory: Path | None, map_location: str | torch.device) -> Any | None:
    if directory is None:
        return None
    return torch.load(directory / STATE_FILE_NAME, map_location=map_location, weights_only=False)


def run_custom(config: TrainerConfig, env: WorkerEnv, run_dir: Path, run: Lifecycle) -> None:
    """Resolve and call the user's function on this worker, then write the result (rank 0)."""
    spec = config.trainer.custom
    assert spec is not None, "trainer.custom is required with trainer.type custom"
    function = resolve(spec)
    run.announce(
        f"custom trainer {spec.function}, {env.world_size} workers on {env.device.type}",
        resumed_at=run.resume.step,
    )
    context = TrainContext(
        config=config,
        args=dict(spec.args or {}),
        run_dir=run_dir,
        export_dir=run.export_dir,
        resume_checkpoint=run.resume.checkpoint,
        resume_step=run.resume.step,
        seed_checkpoint=run.resume.seed,
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=env.device,
        total_steps=run.total_steps,
        _run=run,
    )
    function(context)
    run.total_steps = context.total_steps
    run.end_training()
    run.finish(export=run.existing_export())
