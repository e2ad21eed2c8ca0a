"""The training modes (spec.trainer.type): `builtin` (the platform's step loop), `huggingface` (a
transformers.Trainer over the platform's model and data) and `custom` (the user's function).

Every mode runs in the same worker set-up and the same run lifecycle (lifecycle.py: resume point,
records, checkpoint registration, result). A mode is a small `Mode` object, registered here by
trainer.type; its module (builtin.py, huggingface.py, custom.py) is imported by its `run`, on the
workers. The driver's preflight uses the mode too, and must not import a whole training stack
(data, checkpoints, strategies, peft, transformers' Trainer) that only the workers run. Each mode
names the spec fields it refuses, so a field it cannot honour fails preflight with the field's
name instead of being ignored silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from llmtrain.api.trainer_spec import HF_SEED_UNSUPPORTED

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.lifecycle import Lifecycle


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


class BuiltinMode:
    name = "builtin"
    shaped_checkpoints = True
    refuses: tuple[Refusal, ...] = ()

    def describe(self, config: TrainerConfig) -> str:
        return config.strategy.type

    def preflight(self, config: TrainerConfig) -> None:
        """Everything the loop needs is checked by preflight.py's common checks."""

    def run(self, config: TrainerConfig, env: WorkerEnv, run_dir: Path, lifecycle: Lifecycle) -> None:
        from llmtrain_trainer.modes.builtin import run_builtin

        run_builtin(config, env, run_dir, lifecycle)


class HuggingFaceMode:
    name = "huggingface"
    shaped_checkpoints = True  # the Trainer's files depend on strategy and method
    refuses = (
        Refusal(
            "strategy.fsdp.hybridShardSize",
            lambda config: (
                config.strategy.fsdp is not None and config.strategy.fsdp.hybrid_shard_size is not None
            ),
            "strategy.fsdp.hybridShardSize is not supported with trainer.type huggingface (its FSDP "
            "plugin is configured for plain full sharding); remove it, or use trainer.type builtin",
        ),
        Refusal(
            "resumeFrom.checkpoint",
            lambda config: config.resume_from is not None and bool(config.resume_from.checkpoint),
            HF_SEED_UNSUPPORTED,
        ),
        # accelerate (1.15, AcceleratorState.__init__) keeps the FSDP plugin only for GPU-class
        # distributed types; use_cpu gives MULTI_CPU, so the Trainer would silently drop FSDP and
        # run plain DDP while the job says strategy fsdp. The CRD refuses the same (CEL on spec).
        Refusal(
            "strategy.type",
            lambda config: config.strategy.type == "fsdp" and not config.scaling.use_gpu,
            "trainer.type huggingface with strategy.type fsdp needs GPUs; "
            "use strategy.type ddp on CPU workers",
        ),
    )

    def describe(self, config: TrainerConfig) -> str:
        return f"Hugging Face Trainer, {config.strategy.type}"

    def preflight(self, config: TrainerConfig) -> None:
        """Pass-through arguments must be real TrainingArguments of the installed transformers."""
        hf = config.trainer.huggingface
        if hf is None or not hf.args:
            return
        from llmtrain_trainer.modes.hf_args import unknown_arguments

        unknown = unknown_arguments(hf.args)
        if unknown:
            raise ModeError(
                f"trainer.huggingface.args {unknown} are not transformers.TrainingArguments "
                "of the trainer image's transformers"
            )

    def run(self, config: TrainerConfig, env: WorkerEnv, run_dir: Path, lifecycle: Lifecycle) -> None:
        from llmtrain_trainer.modes.huggingface import run_huggingface

        run_huggingface(config, env, run_dir, lifecycle)


class CustomMode:
    name = "custom"
    shaped_checkpoints = False  # the function's own files: the platform cannot tell their shape
    refuses: tuple[Refusal, ...] = ()  # the function reads the whole config: nothing is ignored for it

    def describe(self, config: TrainerConfig) -> str:
        spec = config.trainer.custom
        return f"custom trainer {spec.function if spec is not None else '?'}"

    def preflight(self, config: TrainerConfig) -> None:
        """The function imports and takes one argument (raises CustomFunctionError)."""
        from llmtrain_trainer.modes.reference import resolve

        if config.trainer.custom is not None:
            resolve(config.trainer.custom)

    def run(self, config: TrainerConfig, env: WorkerEnv, run_dir: Path, lifecycle: Lifecycle) -> None:
        from llmtrain_trainer.modes.custom import run_custom

        run_custom(config, env, run_dir, lifecycle)


MODES: dict[str, Mode] = {"builtin": BuiltinMode(), "huggingface": HuggingFaceMode(), "custom": CustomMode()}
"""trainer.type → its mode."""


def mode_for(trainer_type: str) -> Mode:
    """The registered mode of a trainer.type."""
    try:
        return MODES[trainer_type]
    except KeyError:
        raise ModeError(f"trainer.type {trainer_type!r} is not one of {sorted(MODES)}") from None


def refuse_unsupported(mode: Mode, config: TrainerConfig) -> None:
    """Raise ModeError for the first spec field `config` sets that `mode` refuses."""
    for refusal in mode.refuses:
        if refusal.applies(config):
            raise ModeError(refusal.message)
