"""Checkpoints: written by every rank straight into the run directory, registered with Ray Train.

A checkpoint directory `checkpoint-step-NNNNNNNN/` holds the strategy's sharded state (DCP or
DeepSpeed files), one RNG file per rank and `trainer_state.json` (step, data position), which
rank 0 writes last, after a barrier. It is then reported with `CheckpointUploadMode.NO_UPLOAD`:
the files already sit on the shared storage, so Ray Train only records the path (and deletes old
ones per `num_to_keep`). On start, `ray.train.get_checkpoint()` names the latest one to restore;
a new run may instead load another run's checkpoint (spec.resumeFrom, resume_from.py).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray.train
import torch
import torch.distributed as dist
from ray.train import CheckpointConsistencyMode, CheckpointUploadMode

from llmtrain_trainer.data import DataPosition
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.rundir import STATE_FILE, checkpoint_name
from llmtrain_trainer.strategies.base import Strategy

log = logging.getLogger(__name__)

RNG_DIR = "rng"


@dataclass
class TrainerState:
    """Everything besides model and optimizer that a resumed run needs to continue exactly."""

    step: int = 0
    data: DataPosition = field(default_factory=DataPosition)
    tokens_seen: int = 0
    world_size: int = 1
    shape: dict[str, Any] = field(default_factory=dict)
    """What the files depend on (resume_from.run_shape), checked before another run loads them."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "data": self.data.to_dict(),
            "tokens_seen": self.tokens_seen,
            "world_size": self.world_size,
            "shape": self.shape,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        return cls(
            step=int(data["step"]),
            data=DataPosition.from_dict(data["data"]),
            tokens_seen=int(data.get("tokens_seen", 0)),
            world_size=int(data.get("world_size", 1)),
            shape=dict(data.get("shape") or {}),
        )


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(strategy: Strategy, state: TrainerState, run_dir: Path, env: WorkerEnv) -> Path:
    """Write a complete checkpoint for `state.step` (every rank calls this) and return its path."""
    directory = run_dir / checkpoint_name(state.step)
    if env.is_main and directory.exists():
        # Left over from an attempt that died before reporting it: never registered, so stale.
        shutil.rmtree(directory)
    dist.barrier()
    strategy.save(directory)
    (directory / RNG_DIR).mkdir(parents=True, exist_ok=True)
    torch.save(_rng_state(), directory / RNG_DIR / f"rank-{env.rank}.pt")
    dist.barrier()
    if env.is_main:
        (directory / STATE_FILE).write_text(json.dumps(state.to_dict(), indent=2) + "\n")
    return directory


def report(directory: Path, metrics: dict[str, Any], env: WorkerEnv) -> None:
    """Register the checkpoint with Ray Train (a barrier: every rank calls it).

    `report` returns once the checkpoint is queued; rank 0 then waits until the controller has
    committed it (written its snapshot), so a "checkpoint" progress record means a restart from
    this point is guaranteed, even if the driver dies the next moment.
    """
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


def restore(strategy: Strategy, env: WorkerEnv) -> TrainerState | None:
    """Load the latest reported checkpoint of this run into the strategy; None on a fresh run.

    For a checkpoint on local or mounted storage, `as_directory()` yields the stored directory
    itself, so nothing here writes into it.
    """
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as path:
        return load(strategy, Path(path), env)


def load(strategy: Strategy, directory: Path, env: WorkerEnv, weights_only: bool = False) -> TrainerState:
    """Load a checkpoint directory: all of it (this run's, or one continued by resumeFrom.run),
    or only its weights (a resumeFrom.checkpoint seed), which starts a fresh state at step 0."""
    state_file = directory / STATE_FILE
    if not state_file.exists():
        raise RuntimeError(f"checkpoint {directory} has no {STATE_FILE}: it was not written by llmtrain")
    state = TrainerState.from_dict(json.loads(state_file.read_text()))
    if weights_only:
        log.info("loading the weights of %s (step %d); fresh optimizer and schedule", directory, state.step)
        strategy.load(directory, weights_only=True)
        return TrainerState(world_size=env.world_size)
    if state.world_size != env.world_size and not strategy.reshardable_checkpoints:
        raise RuntimeError(
            f"checkpoint {directory.name} was written by {state.world_size} workers and "
            f"{strategy.name} cannot reshard it for {env.world_size}; resume with "
            f"{state.world_size} workers (or convert it with DeepSpeed's universal checkpoint tools)"
        )
    log.info("restoring step %d from %s", state.step, directory)
    strategy.load(directory)
    rng_file = directory / RNG_DIR / f"rank-{env.rank}.pt"
    if rng_file.exists() and state.world_size == env.world_size:
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return state
