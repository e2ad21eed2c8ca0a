"""Plain data parallel (DDP) for models that fit on one device; checkpoints use DCP like FSDP2."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.nn.parallel import DistributedDataParallel

from llmtrain_trainer import model as models
from llmtrain_trainer.optim import build_optimizer, build_scheduler
from llmtrain_trainer.strategies import Strategy, WorkerEnv, rank_zero_first
from llmtrain_trainer.strategies.sharded_state import (
    gather_full_state,
    load_training_state,
    save_training_state,
)

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig


class DdpStrategy(Strategy):
    name = "ddp"

    def __init__(
        self, config: TrainerConfig, env: WorkerEnv, total_steps: int, initial_weights: bool = True
    ) -> None:
        super().__init__(config, env, total_steps, initial_weights)
        if models.is_pretrained(config.model) and self.initial_weights:
            with rank_zero_first(env):  # one download into the shared Hugging Face cache
                base: torch.nn.Module = models.load_pretrained(config.model, torch.float32)
        else:
            base = models.build_from_config(
                models.model_config(config.model), torch.float32, meta=False, seed=config.training.seed
            )
        torch.manual_seed(config.training.seed)
        base = models.apply_lora(base, config.method)
        if config.training.gradient_checkpointing:
            models.enable_gradient_checkpointing(base)
        base.to(env.device)
        self.ddp = DistributedDataParallel(base, device_ids=[env.device.index] if env.on_gpu else None)
        self.model = self.ddp
        self.optimizer = build_optimizer(self.model.parameters(), config.training, env.on_gpu)
        self.scheduler = build_scheduler(self.optimizer, config.training, total_steps)
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype == torch.float16 else None
        # LoRA checkpoints hold the adapters only: the frozen base comes from the pretrained weights.
        self._options = StateDictOptions(ignore_frozen_params=self.lora, strict=not self.lora)

    def _autocast(self) -> AbstractContextManager[object]:
        if self.env.on_gpu and self.dtype != torch.float32:
            return torch.autocast("cuda", dtype=self.dtype)
        return nullcontext()

    def _sync_context(self, last_micro_batch: bool) -> AbstractContextManager[object]:
        # Gradients are all-reduced only in the backward of the step's last micro-batch.
        return nullcontext() if last_micro_batch else self.ddp.no_sync()

    def _backward(self, loss: torch.Tensor, last_micro_batch: bool) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()  # type: ignore[no-untyped-call]

    def step(self) -> torch.Tensor | float | None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.config.training.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), max_norm if max_norm > 0 else float("inf")
        )
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
            self.model, self.optimizer, self.scheduler, directory, self.env.is_main, self._options
        )

    def load(self, directory: Path) -> None:
        load_training_state(self.model, self.optimizer, self.scheduler, directory, self._options)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return gather_full_state(self.model, self.env.is_main)
