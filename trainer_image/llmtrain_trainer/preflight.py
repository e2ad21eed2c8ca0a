"""Checks run in the driver before any worker starts, so a mistake fails in seconds with one line.

A mistake found inside the workers would instead cost a worker-group start per attempt and be
retried `maxWorkerFailures` times; everything that can be decided from the config, the files and
the model's config.json is decided here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from llmtrain import memory
from llmtrain.api.spec import DeepSpeedSpec, LoraSpec
from llmtrain.api.trainer_config import TrainerConfig
from transformers import PretrainedConfig

from llmtrain_trainer import model as models
from llmtrain_trainer.data import DataError, data_files
from llmtrain_trainer.modes import ModeError, mode_for, refuse_unsupported
from llmtrain_trainer.modes.reference import CustomFunctionError
from llmtrain_trainer.resume_from import ResumeFromError, check_compatible
from llmtrain_trainer.resume_from import resolve as resolve_resume_source
from llmtrain_trainer.rundir import latest_checkpoint
from llmtrain_trainer.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


class PreflightError(ValueError):
    """The run cannot start; the message names the field and what to change."""


def check(config: TrainerConfig) -> None:
    """Raise PreflightError on the first problem found."""
    try:
        _check_strategy(config)
        _check_tracking(config)
        _check_dataset(config)
        hf_config = models.model_config(config.model)
        models.check_causal_lm(hf_config)
        _check_tokenizer(config, int(getattr(hf_config, "vocab_size", 0) or 0))
        # One meta-device build (no memory) serves the LoRA target and memory checks.
        skeleton = models.build_from_config(hf_config, torch.float32, meta=True, seed=0)
        _check_lora_targets(config, hf_config, skeleton)
        _check_memory(config, hf_config, skeleton)
        _check_export(config, models.count_parameters(skeleton)[0])
        _check_storage(Path(config.storage_path))
        _check_trainer(config)
        _check_resume_from(config)
    except (models.ModelError, DataError, ResumeFromError, CustomFunctionError, ModeError) as exc:
        raise PreflightError(str(exc)) from exc


def _check_strategy(config: TrainerConfig) -> None:
    on_gpu = config.scaling.use_gpu
    if not on_gpu and config.training.precision == "fp16":
        raise PreflightError("training.precision fp16 needs GPUs; use fp32 or bf16 (CPUs compute in fp32)")
    ds = config.strategy.deepspeed
    if config.strategy.type == "deepspeed":
        if ds is not None and ds.offload_params and ds.zero_stage != 3:
            raise PreflightError("strategy.deepspeed.offloadParams needs zeroStage: 3")
        if ds is not None and ds.offload_optimizer and not on_gpu:
            raise PreflightError("strategy.deepspeed.offloadOptimizer needs GPUs")
        try:
            import deepspeed  # noqa: F401
        except ImportError as exc:
            raise PreflightError(f"strategy.type deepspeed: DeepSpeed is not installed ({exc})") from exc


def _check_tracking(config: TrainerConfig) -> None:
    """A tracker's client must be installed before any worker starts, not found missing on rank 0."""
    from llmtrain_trainer.tracking import missing_packages

    missing = missing_packages(config)
    if missing:
        raise PreflightError(
            f"spec.tracking.{missing[0]} needs the Python package {missing[0]!r}, which this trainer lacks: "
            "install llmtrain with its [track] extra (the trainer image has it)"
        )


def _check_dataset(config: TrainerConfig) -> None:
    if config.dataset.path is not None:
        data_files(Path(config.dataset.path))  # raises DataError naming the path
    if config.dataset.validation_path is not None:
        data_files(Path(config.dataset.validation_path), "dataset.validationPath")


def _check_tokenizer(config: TrainerConfig, vocab_size: int) -> None:
    try:
        tokenizer = load_tokenizer(config.model)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PreflightError(
            f"model.tokenizer {config.model.tokenizer or config.model.name!r}: cannot load it ({first})"
        ) from exc
    if vocab_size and len(tokenizer) > vocab_size:
        raise PreflightError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}; "
            f"raise model.config.vocab_size to at least {len(tokenizer)}"
        )


def _check_lora_targets(
    config: TrainerConfig, hf_config: PretrainedConfig, skeleton: torch.nn.Module
) -> None:
    if config.method.type != "lora":
        return
    targets = (config.method.lora or LoraSpec()).target_modules
    leaf_names = {name.rsplit(".", 1)[-1] for name, _ in skeleton.named_modules()}
    unknown = [t for t in targets if t not in leaf_names]
    if unknown:
        raise PreflightError(
            f"method.lora.targetModules {unknown} name no module of {hf_config.model_type} "
            f"(it has e.g. {sorted(n for n in leaf_names if n.endswith('proj'))[:8]})"
        )


def _check_memory(config: TrainerConfig, hf_config: PretrainedConfig, skeleton: torch.nn.Module) -> None:
    """Refuse a plan whose states cannot fit one device, before any worker allocates memory; the
    parameters are counted on a meta-device build, so any architecture is counted exactly."""
    plan = memory.Plan.of_trainer(config)
    counted = models.count_parameters(skeleton)[0]
    estimate = memory.estimate(plan, hf_config.to_dict(), counted)
    if estimate is not None and estimate.peak is not None:
        peak = memory.human_bytes(estimate.peak)
        log.info("memory estimate per device: %s (%s)", peak, estimate.breakdown())
    for finding in memory.check(plan, hf_config.to_dict(), counted):
        if finding.error:
            raise PreflightError(f"spec: {finding.message}")
        log.warning("spec: memory: %s", finding.message)


def _check_export(config: TrainerConfig, parameters: int) -> None:
    """Say that a Hugging Face mode export gathers the whole model on rank 0 (not refused: it fits
    small and mid-size models; the built-in loop streams its export one tensor at a time).

    transformers' save_model goes through accelerate's `get_state_dict`: a full fp32
    FULL_STATE_DICT under FSDP, the 16-bit consolidated state dict under ZeRO-3. DDP and ZeRO-1/2
    ranks hold the whole model anyway, so nothing more is gathered there."""
    if config.trainer.type != "huggingface" or not config.checkpoint.export:
        return
    strategy = config.strategy
    if strategy.type == "fsdp":
        size, what = parameters * 4, "an fp32 full state dict"
    elif strategy.type == "deepspeed" and (strategy.deepspeed or DeepSpeedSpec()).zero_stage == 3:
        size, what = parameters * 2, "a 16-bit consolidated state dict"
    else:
        return
    log.warning(
        "checkpoint.export with trainer.type huggingface and strategy %s gathers the whole model on "
        "rank 0 (%s, about %s of host memory on that worker at the end of the run); "
        "trainer.type builtin streams the export one tensor at a time",
        strategy.type,
        what,
        memory.human_bytes(size),
    )


def _check_storage(storage: Path) -> None:
    try:
        storage.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PreflightError(f"storage path {storage} cannot be created: {exc.strerror or exc}") from exc
    if not os.access(storage, os.W_OK):
        raise PreflightError(f"storage path {storage} is not writable by uid {os.getuid()}")


def _check_resume_from(config: TrainerConfig) -> None:
    """A missing or unloadable resumeFrom target fails here, unless the run already has its own
    checkpoints (a retry), which it then resumes instead."""
    if config.resume_from is None or latest_checkpoint(Path(config.run_dir)) is not None:
        return
    check_compatible(resolve_resume_source(config.resume_from, Path(config.run_dir)), config)


def _check_trainer(config: TrainerConfig) -> None:
    """The spec fields the trainer mode refuses, then the mode's own checks (modes/)."""
    mode = mode_for(config.trainer.type)
    refuse_unsupported(mode, config)
    mode.preflight(config)
