"""Checkpoints: written by every rank straight into the run directory, registered with the launcher.

A checkpoint directory `checkpoint-step-NNNNNNNN/` holds the strategy's sharded state (DCP or
DeepSpeed files), one RNG file per rank and `trainer_state.json` (`TrainerState`: step, data
position, trainer, shape), which rank 0 writes last, after every rank's files are on disk. Every
trainer mode's checkpoints carry the same state file (the Hugging Face and custom modes write their
own files into the directory, lifecycle.py registers it), and `complete` is its one writer. With
checkpoint.asyncSave the shards are written in the background (`start`), and training goes on
until the next checkpoint, the export or the end, which first `complete` the pending one. It is
then reported through the run context (run_context.py: to Ray Train with NO_UPLOAD, which only
records the path and deletes old ones per `num_to_keep`; without Ray, old ones are pruned the same
way). On start, the context names the latest one to restore; when it is incomplete or corrupt (a
torn shard, a lost file), the older complete ones in the run directory are tried, newest first. A
new run may instead load another run's checkpoint (spec.resumeFrom, resume_from.py).
"""

from __future__ import annotations

import json
import logging
import random
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from llmtrain_trainer.data import DataPosition
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.rundir import (
    STATE_FILE,
    checkpoint_name,
    checkpoint_order,
    complete_checkpoints,
    write_durably,
)
from llmtrain_trainer.strategies.base import Strategy

log = logging.getLogger(__name__)

RNG_DIR = "rng"


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete or unreadable: restoring tries an older one instead."""


class IncompatibleCheckpoint(RuntimeError):
    """A sound checkpoint that this run cannot load (e.g. another worker count for DeepSpeed).

    Never skipped: every older checkpoint of the run has the same problem, and silently going back
    would throw away training; the message says how to resume.
    """


@dataclass
class Restored:
    """What `restore` loaded, and the newer checkpoints it had to pass over (with the reasons)."""

    state: TrainerState
    directory: Path
    skipped: list[str] = field(default_factory=list)


@dataclass
class TrainerState:
    """Everything besides model and optimizer that a resumed run needs to continue exactly: the
    one format of `trainer_state.json`, whichever mode wrote the checkpoint."""

    step: int = 0
    data: DataPosition = field(default_factory=DataPosition)
    """The built-in loop's place in the data (the other modes keep their own)."""
    tokens_seen: int = 0
    samples_seen: int = 0
    """Sequences all ranks consumed (microBatchSize × accumulation × workers per step): the clock
    of an epochs-based LR schedule, which must not depend on the worker count (steps do)."""
    world_size: int = 1
    shape: dict[str, Any] = field(default_factory=dict)
    """What the files depend on (resume_from.run_shape), checked before another run loads them;
    empty where the files are the user's own (trainer.type custom)."""
    trainer: str = "builtin"
    """The trainer.type that wrote the files: each mode reads only its own."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """The built-in loop's best validation loss and patience used (evaluation.EvalTracker)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "data": self.data.to_dict(),
            "tokens_seen": self.tokens_seen,
            "samples_seen": self.samples_seen,
            "world_size": self.world_size,
            "shape": self.shape,
            "trainer": self.trainer,
            "evaluation": self.evaluation,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        """Also reads the state files written before the format was one (no data, no trainer)."""
        return cls(
            step=int(data["step"]),
            data=DataPosition.from_dict(data["data"]) if data.get("data") else DataPosition(),
            tokens_seen=int(data.get("tokens_seen", 0)),
            samples_seen=int(data.get("samples_seen", 0)),
            world_size=int(data.get("world_size", 1)),
            shape=dict(data.get("shape") or {}),
            trainer=str(data.get("trainer", "builtin")),
            evaluation=dict(data.get("evaluation") or {}),
        )

    @classmethod
    def read(cls, directory: Path) -> TrainerState | None:
        """The state file of a checkpoint directory, or None when it has none (incomplete)."""
        state_file = directory / STATE_FILE
        return cls.from_dict(json.loads(state_file.read_text())) if state_file.exists() else None


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


@dataclass
class PendingCheckpoint:
    """A checkpoint whose shards may still be being written: neither complete nor registered yet."""

    directory: Path
    step: int
    state_text: bytes
    """trainer_state.json as of the save; written only once every rank's shards are on disk."""
    written: Future[Any]
    """This rank's share of the strategy's files (checkpoint.asyncSave writes them in a thread)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """What the report to the run context carries with it."""


def start(strategy: Strategy, state: TrainerState, run_dir: Path, env: WorkerEnv) -> PendingCheckpoint:
    """Begin the checkpoint of `state.step` (every rank calls this): the strategy's save (possibly
    still running when this returns) and this rank's RNG file, both as of now."""
    directory = prepare(run_dir, state.step, env)
    written = strategy.start_save(directory)
    (directory / RNG_DIR).mkdir(parents=True, exist_ok=True)
    rng_state = _rng_state()
    write_durably(directory / RNG_DIR / f"rank-{env.rank}.pt", lambda file: torch.save(rng_state, file))
    return PendingCheckpoint(directory, state.step, state_text(state), written)


def prepare(run_dir: Path, step: int, env: WorkerEnv) -> Path:
    """A new, empty `checkpoint-step-N/` for every rank to write into (a collective).

    Never a directory that exists: after falling back past a corrupt checkpoint, or after an
    attempt died around its report, Ray Train may have registered that path already. Ray keys its
    entries by report, not by path, so re-using the path would make it track two entries for one
    directory, delete the new files when retiring the old entry, then fail on the missing path
    (and a restarted driver refuse the run). A later save of the step gets `checkpoint-step-N-K/`.
    """
    names: list[str | None] = [None]
    if env.is_main:
        copy = 0
        while (run_dir / checkpoint_name(step, copy)).exists():
            copy += 1
        (run_dir / checkpoint_name(step, copy)).mkdir(parents=True)
        names[0] = checkpoint_name(step, copy)
    dist.broadcast_object_list(names, src=0)
    assert names[0] is not None
    return run_dir / names[0]


def state_text(state: TrainerState) -> bytes:
    """`trainer_state.json` as of now (the state goes on changing while the shards are written)."""
    return (json.dumps(state.to_dict(), indent=2) + "\n").encode()


def written(directory: Path, step: int, state: TrainerState) -> PendingCheckpoint:
    """A checkpoint whose files every rank has already written (the modes that write their own)."""
    done: Future[Any] = Future()
    done.set_result(None)
    return PendingCheckpoint(directory, step, state_text(state), done)


def complete(pending: PendingCheckpoint, env: WorkerEnv) -> Path:
    """Wait until every rank's files are written, then rank 0 writes the state file: the last file,
    so a checkpoint with one is whole (restore and resumeFrom rely on it). Raises, leaving the
    checkpoint without a state file, when this rank's write failed."""
    pending.written.result()
    dist.barrier()
    if env.is_main:

        def write_state(file: BinaryIO) -> None:
            file.write(pending.state_text)

        write_durably(pending.directory / STATE_FILE, write_state)
    return pending.directory


def save(strategy: Strategy, state: TrainerState, run_dir: Path, env: WorkerEnv) -> Path:
    """Write a complete checkpoint for `state.step` (every rank calls this) and return its path."""
    return complete(start(strategy, state, run_dir, env), env)


def restore(strategy: Strategy, env: WorkerEnv, run_dir: Path, latest: Path | None) -> Restored | None:
    """Load `latest`, the run context's latest checkpoint of this run, into the strategy; None on
    a fresh run (`latest` None).

    When the latest one is incomplete or corrupt, the older complete checkpoints in the run
    directory are tried, newest first (never a newer one: the launcher did not register it). Every
    rank tries the same directory and all agree before moving on, since a torn shard may break
    only one rank's read. Loading a checkpoint overwrites all of the state a failed attempt may
    have half-loaded.
    """
    if latest is None:
        return None
    older = (p for p in complete_checkpoints(run_dir) if checkpoint_order(p) < checkpoint_order(latest))
    candidates = [latest, *older]
    skipped: list[str] = []
    for directory in candidates:
        state, failure = _try_load(strategy, directory, env)
        failures: list[str | None] = [None] * env.world_size
        dist.all_gather_object(failures, failure)
        problems = [f"rank {rank}: {text}" for rank, text in enumerate(failures) if text is not None]
        if state is not None and not problems:
            if skipped and env.is_main:
                log.warning("resuming from %s, the newest usable checkpoint", directory.name)
            return Restored(state, directory, skipped)
        reason = f"{directory.name} ({'; '.join(problems)})"
        if env.is_main:
            log.warning("skipping checkpoint %s", reason)
        skipped.append(reason)
    raise CheckpointError(
        f"no usable checkpoint in {run_dir}: {'; '.join(skipped)}. Restore the files, or delete the "
        "run directory to start the run afresh"
    )


def _try_load(strategy: Strategy, directory: Path, env: WorkerEnv) -> tuple[TrainerState | None, str | None]:
    """`load`, with any failure of the files turned into a reason (a torn or missing file shows up
    as an OSError, a JSON or unpickling error, a DCP CheckpointException, ...)."""
    try:
        return load(strategy, directory, env), None
    except IncompatibleCheckpoint:
        raise
    except (Exception, CheckpointException) as error:  # DCP's is a BaseException
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return None, f"{type(error).__name__}: {first_line}"[:500]


def load(strategy: Strategy, directory: Path, env: WorkerEnv, weights_only: bool = False) -> TrainerState:
    """Load a checkpoint directory: all of it (this run's, or one continued by resumeFrom.run),
    or only its weights (a resumeFrom.checkpoint seed), which starts a fresh state at step 0."""
    state = TrainerState.read(directory)
    if state is None:
        raise CheckpointError(
            f"checkpoint {directory} has no {STATE_FILE}: it is incomplete or was not written by llmtrain"
        )
    if weights_only:
        log.info("loading the weights of %s (step %d); fresh optimizer and schedule", directory, state.step)
        strategy.load(directory, weights_only=True)
        return TrainerState(world_size=env.world_size)
    if state.world_size != env.world_size and not strategy.reshardable_checkpoints:
        raise IncompatibleCheckpoint(
            f"checkpoint {directory.name} was written by {state.world_size} workers and "
            f"{strategy.name} cannot reshard it for {env.world_size}; resume with "
            f"{state.world_size} workers (or convert it with DeepSpeed's universal checkpoint tools)"
        )
    log.info("restoring step %d from %s", state.step, directory)
    strategy.load(directory)
    if state.world_size == env.world_size:
        # Another worker count draws different dropout masks anyway: its RNG files do not apply.
        rng_file = directory / RNG_DIR / f"rank-{env.rank}.pt"
        if not rng_file.exists():
            raise CheckpointError(f"checkpoint {directory} has no {RNG_DIR}/{rng_file.name}")
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return state
