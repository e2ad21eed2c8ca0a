"""spec.resumeFrom in the trainer: find the checkpoint a new run starts from, or say why it cannot.

Only a run's first attempt reads it: once the run has a checkpoint of its own, Ray Train resumes
that. `run` continues an earlier run from its latest complete checkpoint with all of its state
(weights, optimizer, LR schedule, step, data position), so it needs the same run shape: strategy
and method. `checkpoint` seeds the weights only, with a fresh optimizer and schedule from step 0; it
needs the same checkpoint format (DCP for FSDP and DDP, DeepSpeed's own files) and method, since a
LoRA checkpoint holds only the adapters. Every message names the resumeFrom field and its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrain.api.spec import DeepSpeedSpec
from llmtrain.api.trainer_config import ResumeSource, TrainerConfig

from llmtrain_trainer.rundir import STATE_FILE, latest_checkpoint


class ResumeFromError(ValueError):
    """The resumeFrom target is missing or cannot be loaded by this job; the message names it."""


@dataclass(frozen=True)
class Seed:
    """A checkpoint to start from: all of its state (continuing a run) or its weights only."""

    directory: Path
    full_state: bool
    described: str


def run_shape(config: TrainerConfig) -> dict[str, Any]:
    """What a checkpoint's files depend on; recorded in every checkpoint's trainer state."""
    strategy = config.strategy
    zero_stage = (strategy.deepspeed or DeepSpeedSpec()).zero_stage if strategy.type == "deepspeed" else None
    return {"strategy": strategy.type, "zeroStage": zero_stage, "method": config.method.type}


def resolve(source: ResumeSource, own_run_dir: Path) -> Seed:
    if source.run is not None:
        if source.run in (own_run_dir.name, f"{own_run_dir.parent.name}/{own_run_dir.name}"):
            raise ResumeFromError(f"resumeFrom.run {source.run!r} names this job's own run")
        run_dir = find_run(Path(source.runs_root), source.run)
        latest = latest_checkpoint(run_dir)
        if latest is None:
            raise ResumeFromError(f"resumeFrom.run {source.run!r}: {run_dir} holds no complete checkpoint")
        return Seed(latest, full_state=True, described=f"run {source.run} ({latest})")
    if source.checkpoint is None:
        raise ResumeFromError("resumeFrom names neither a run nor a checkpoint")
    directory = Path(source.checkpoint)
    if not directory.is_dir():
        raise ResumeFromError(f"resumeFrom.checkpoint {directory} does not exist")
    if not (directory / STATE_FILE).is_file():
        raise ResumeFromError(
            f"resumeFrom.checkpoint {directory} is not a complete llmtrain checkpoint (no {STATE_FILE}); "
            "name a checkpoint-step-NNNNNNNN directory"
        )
    return Seed(directory, full_state=False, described=f"checkpoint {directory}")


def find_run(runs_root: Path, ref: str) -> Path:
    """'<job>/<run id>' directly; a bare run id (a uid is unique) under any job of the namespace."""
    if "/" in ref:
        path = runs_root / ref
        if not path.is_dir():
            raise ResumeFromError(f"resumeFrom.run {ref!r}: no run directory {path}")
        return path
    matches = sorted(p for p in runs_root.glob(f"*/{ref}") if p.is_dir())
    if not matches:
        raise ResumeFromError(f"resumeFrom.run {ref!r}: no run with that id under {runs_root}")
    if len(matches) > 1:
        names = ", ".join(str(p.relative_to(runs_root)) for p in matches)
        raise ResumeFromError(f"resumeFrom.run {ref!r} is ambiguous ({names}): write '<job name>/{ref}'")
    return matches[0]


def check_compatible(seed: Seed, config: TrainerConfig) -> None:
    """Refuse a checkpoint this job could not load, before any worker starts."""
    from llmtrain_trainer.checkpoint import TrainerState  # torch: only once there is a seed

    state = TrainerState.read(seed.directory)
    assert state is not None, "resolve() returns complete checkpoints only"
    trainer = state.trainer
    if trainer != config.trainer.type:
        raise ResumeFromError(
            f"resumeFrom {seed.described} was written by trainer.type {trainer} (this job: "
            f"{config.trainer.type}); each trainer reads only its own checkpoints: name a "
            f"{config.trainer.type} run or checkpoint, or drop spec.resumeFrom"
        )
    written = state.shape
    if not written:
        return  # written before checkpoints recorded their shape: loading will tell
    wanted = run_shape(config)
    keys: tuple[str, ...]
    if seed.full_state:
        keys = ("strategy", "zeroStage", "method")
        hint = "; use resumeFrom.checkpoint to take its weights only"
    else:
        keys = ("method",)
        hint = ""
        if (written["strategy"] == "deepspeed") != (wanted["strategy"] == "deepspeed"):
            keys = ("strategy", "method")
        if written.get("zeroStage") == 3:
            raise ResumeFromError(
                f"resumeFrom {seed.described}: a ZeRO-3 checkpoint can only be continued "
                "(resumeFrom.run), not used for its weights alone"
            )
    different = [f"{k} {written.get(k)} (this job: {wanted[k]})" for k in keys if written.get(k) != wanted[k]]
    if different:
        raise ResumeFromError(f"resumeFrom {seed.described} was written with {', '.join(different)}{hint}")
