"""The training modes (spec.trainer.type): `builtin` (the platform's step loop), `huggingface` (a
transformers.Trainer over the platform's model and data) and `custom` (the user's function).

Every mode runs in the same worker set-up and the same run lifecycle (lifecycle.py: resume point,
records, checkpoint registration, result). A mode is a small `Mode` object, registered here by
trainer.type and imported on first use (the Hugging Face mode brings transformers' Trainer and
peft). Each mode names the spec fields it refuses, so a field it cannot honour fails preflight
with the field's name instead of being ignored silently.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.lifecycle import Lifecycle

MODULES = {
    "builtin": "llmtrain_trainer.modes.builtin",
    "huggingface": "llmtrain_trainer.modes.huggingface",
    "custom": "llmtrain_trainer.modes.custom",
}
"""trainer.type → the module whose `MODE` runs it."""


class ModeError(ValueError):
    """The spec asks a mode for something it does not do; the message names the field."""


@dataclass(frozen=True)
class Refusal:
    """A spec field (or combination) a mode cannot honour."""

    field: str
    """The spec path, e.g. `strategy.fsdp.hybridShardSize`."""
    applies: Callable[[TrainerConfig], bool]
    message: str
    """What to change; it names `field`."""


class Mode(Protocol):
    """What the worker entry point, preflight and `llmtrain run` need from a mode."""

    @property
    def name(self) -> str:
        """Its trainer.type."""

    @property
    def shaped_checkpoints(self) -> bool:
        """Whether its checkpoint files depend on the run shape (strategy, ZeRO stage, method),
        which resumeFrom then checks; the custom function's files are its own business."""

    @property
    def refuses(self) -> tuple[Refusal, ...]:
        """The spec fields it cannot honour."""

    def describe(self, config: TrainerConfig) -> str:
        """A few words for the driver's messages, e.g. `Hugging Face Trainer, ddp`."""

    def preflight(self, config: TrainerConfig) -> None:
        """Mode-specific checks in the driver, before any worker starts (raise ModeError or the
        checked module's own error)."""

    def run(self, config: TrainerConfig, env: WorkerEnv, run_dir: Path, lifecycle: Lifecycle) -> None:
        """Train on this worker; every rank calls it. It announces the start through the lifecycle
        (`announce`), reports through it, and ends with `lifecycle.finish`."""


def mode_for(trainer_type: str) -> Mode:
    """The registered mode of a trainer.type."""
    try:
        module = MODULES[trainer_type]
    except KeyError:
        raise ModeError(f"trainer.type {trainer_type!r} is not one of {sorted(MODULES)}") from None
    mode: Mode = importlib.import_module(module).MODE
    return mode


def refuse_unsupported(mode: Mode, config: TrainerConfig) -> None:
    """Raise ModeError for the first spec field `config` sets that `mode` refuses."""
    for refusal in mode.refuses:
        if refusal.applies(config):
            raise ModeError(refusal.message)
