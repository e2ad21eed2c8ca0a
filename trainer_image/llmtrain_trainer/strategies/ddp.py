"""Plain data parallel (DDP) for models that fit on one device; checkpoints use DCP like FSDP2."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.nn.parallel import DistributedDataParallel

from llmtrain_trainer import model as models
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.optim import build_optimizer, build_scheduler
from llmtrain_trainer.strategies.torch_native import TorchNativeStrategy, loss_scaler
from llmtrain_trainer.weights import fetch_weights

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig


class DdpStrategy(TorchNativeStrategy):
    name = "ddp"

    def __init__(
        self, config: TrainerConfig, env: WorkerEnv, total_steps: int, initial_weights: bool = True
    ) -> None:
        super().__init__(config, env, total_steps, initial_weights)
        if models.is_pretrained(config.model) and self.initial_weights:
            folder = fetch_weights(config.model, env)
            base: torch.nn.Module = models.load_pretrained(folder, config.model, torch.float32)
        else:
            base = models.build_from_config(
                models.model_config(config.model), torch.float32, meta=False, seed=config.training.seed
            )
        torch.manual_seed(config.training.seed)
        base = models.apply_lora(base, config.method)
        # A LoRA base has no fp32 master (autocast then has nothing to cast for it).
        models.hold_frozen_in(base, self.dtype)
        self.attention = models.use_packed_attention(base, config.dataset, env.on_gpu)
        if config.training.gradient_checkpointing:
            models.enable_gradient_checkpointing(base, config.training.checkpoint_every_blocks)
        if models.compile_wanted(config.training.compile, env.on_gpu):
            self.compile_failures = models.compile_blocks(base)
        base.to(env.device)
        self.ddp = DistributedDataParallel(base, device_ids=[env.device.index] if env.on_gpu else None)
        self.model = self.ddp
        self.optimizer = build_optimizer(self.model, config.training, env.on_gpu)
        self.scheduler = build_scheduler(self.optimizer, config.training, total_steps)
        self.scaler = loss_scaler(self.dtype, env.device, sharded=False)
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
        self._scaled_backward(loss)

    def _export_module(self) -> torch.nn.Module:
        module: torch.nn.Module = self.ddp.module
        return module
