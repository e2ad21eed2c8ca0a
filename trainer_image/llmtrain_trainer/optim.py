"""AdamW and the learning-rate schedule (linear warm-up, then cosine, linear or constant)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial

import torch
from llmtrain.api.spec import TrainingSpec
from torch.optim.lr_scheduler import LambdaLR


def warmup_steps(training: TrainingSpec, total_steps: int) -> int:
    return math.ceil(training.warmup_ratio * total_steps)


def lr_factor(step: int, *, warmup: int, total: int, kind: str) -> float:
    """Multiplier of the peak learning rate for the optimizer step with index `step` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    params: Iterable[torch.nn.Parameter], training: TrainingSpec, on_gpu: bool
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; the fused kernel on GPUs."""
    trainable = [p for p in params if p.requires_grad]
    return torch.optim.AdamW(
        trainable,
        lr=training.learning_rate,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=training.weight_decay,
        fused=True if on_gpu else None,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, training: TrainingSpec, total_steps: int) -> LambdaLR:
    schedule = partial(
        lr_factor, warmup=warmup_steps(training, total_steps), total=total_steps, kind=training.lr_scheduler
    )
    return LambdaLR(optimizer, schedule)
