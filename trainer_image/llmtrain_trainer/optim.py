"""AdamW and the learning-rate schedule (linear warm-up, then cosine, linear or constant)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from llmtrain.api.spec import TrainingSpec
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler


def warmup_steps(training: TrainingSpec, total_steps: int) -> int:
    return math.ceil(training.warmup_ratio * total_steps)


def lr_factor(step: float, *, warmup: int, total: int, kind: str, shift: float = 0.0) -> float:
    """Multiplier of the peak learning rate for the optimizer step with index `step` (0-based).

    `shift` moves a resumed run onto the schedule of its new worker count (`rebase_scheduler`)."""
    step += shift
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The trainable parameters in two AdamW groups: decay for the matmul weights, none for norm
    gains and biases (1-D) and for embeddings, whose decay only shrinks them toward zero.

    Shapes are the full ones: a ZeRO-3 partition is an empty 1-D tensor with the shape in
    `ds_shape`, and an FSDP2 DTensor reports its global shape.
    """
    embeddings = {
        id(param)
        for module in model.modules()
        if isinstance(module, nn.Embedding)
        for param in module.parameters(recurse=False)
    }
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for _, param in model.named_parameters():  # a tied tensor once
        if not param.requires_grad:
            continue
        shape = getattr(param, "ds_shape", None) or param.shape
        (no_decay if len(shape) < 2 or id(param) in embeddings else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def build_optimizer(model: nn.Module, training: TrainingSpec, on_gpu: bool) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (`parameter_groups`); the fused kernel on GPUs."""
    return torch.optim.AdamW(
        parameter_groups(model, training.weight_decay),
        lr=training.learning_rate,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=True if on_gpu else None,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, training: TrainingSpec, total_steps: int) -> LambdaLR:
    schedule = partial(
        lr_factor, warmup=warmup_steps(training, total_steps), total=total_steps, kind=training.lr_scheduler
    )
    return LambdaLR(optimizer, schedule)


def rebase_scheduler(scheduler: LRScheduler, training: TrainingSpec, total_steps: int, shift: float) -> None:
    """Put a restored schedule on the one a run of `total_steps` steps follows, `shift` steps
    ahead of the restored step count: a run resumed on another worker count continues at the
    same point of its schedule (its samples seen), not at the same step number. The learning
    rate of the next step changes at once."""
    assert isinstance(scheduler, LambdaLR), type(scheduler)
    factor = partial(
        lr_factor,
        warmup=warmup_steps(training, total_steps),
        total=total_steps,
        kind=training.lr_scheduler,
        shift=shift,
    )
    scheduler.lr_lambdas = [factor] * len(scheduler.optimizer.param_groups)
    for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
