"""What FSDP2 and DDP share: a torch optimizer with an optional fp16 loss scaler, gradient clipping,
and sharded DCP checkpoints (`sharded_state`). Subclasses build `model`, `optimizer`, `scheduler`,
`scaler` and `_options`, and say how the backward of a micro-batch syncs gradients.
"""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LRScheduler

from llmtrain_trainer.strategies.base import ExportTensor, Strategy, named_state_tensors
from llmtrain_trainer.strategies.sharded_state import (
    gather_full_state,
    load_model_state,
    load_training_state,
    save_training_state,
    start_training_state_save,
)


def loss_scaler(dtype: torch.dtype, device: torch.device, sharded: bool) -> torch.amp.GradScaler | None:
    """fp16 needs dynamic loss scaling (bf16 and fp32 do not); FSDP2's sharded gradients need the
    scaler that all-reduces its inf/NaN check across ranks."""
    if dtype != torch.float16:
        return None
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type)
    return torch.amp.GradScaler(device.type)


class TorchNativeStrategy(Strategy):
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    scaler: torch.amp.GradScaler | None
    _options: StateDictOptions
    _save_group: dist.ProcessGroup | None = None
    """The gloo group the background checkpoint writer's collectives use (made at the first one)."""

    def _scaled_backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()  # type: ignore[no-untyped-call]

    def step(self) -> torch.Tensor | float | None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.config.training.max_grad_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach()

    @property
    def learning_rate(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def save(self, directory: Path) -> None:
        save_training_state(
            self.model,
            self.optimizer,
            self.scheduler,
            directory,
            self.env.is_main,
            self._options,
            self.scaler,
        )

    def start_save(self, directory: Path) -> Future[Any]:
        if not self.config.checkpoint.async_save:
            return super().start_save(directory)
        if self._save_group is None:
            self._save_group = dist.new_group(backend="gloo")
        return start_training_state_save(
            self.model,
            self.optimizer,
            self.scheduler,
            directory,
            self.env.is_main,
            self._options,
            self._save_group,
            self.scaler,
        )

    def load(self, directory: Path, weights_only: bool = False) -> None:
        if weights_only:
            load_model_state(self.model, directory, self._options)
        else:
            load_training_state(
                self.model, self.optimizer, self.scheduler, directory, self._options, self.scaler
            )

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return gather_full_state(self.model, self.env.is_main)

    def _export_module(self) -> nn.Module:
        """The model whose names the export keeps (DDP overrides this to drop its wrapper)."""
        return self.model

    def export_tensors(self) -> list[ExportTensor]:
        return [
            ExportTensor(
                name,
                tuple(tensor.shape),  # a DTensor's shape is the global one
                tensor.dtype,
                tensor.requires_grad,
                partial(_gather, tensor, self.env.is_main),
            )
            for name, tensor in named_state_tensors(self._export_module())
        ]


def _gather(tensor: torch.Tensor, is_main: bool) -> torch.Tensor | None:
    """The full tensor on rank 0's CPU; FSDP2 shards are all-gathered (every rank takes part)."""
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return full.detach().cpu() if is_main else None
