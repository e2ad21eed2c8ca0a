"""The `Strategy` interface the loop talks to, and what every implementation shares.

Each implementation owns its model, optimizer and scheduler, because FSDP2, DeepSpeed and DDP each
insist on building those their own way; the forward and backward pass around the loss (loss.py)
and the precision rule are the same for all of them and live here.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from llmtrain.memory import LOSS_CHUNK_TOKENS
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.loss import causal_lm, head_loss_forward, token_loss_sum
from llmtrain_trainer.model import CompileFailures

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig


def compute_dtype(precision: str, env: WorkerEnv) -> torch.dtype:
    """bf16/fp16 only on GPUs; a CPU always computes in fp32."""
    if not env.on_gpu:
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


@dataclass(frozen=True)
class ExportTensor:
    """One tensor of the model for the export, before anything is gathered."""

    name: str
    """Its name in the (possibly peft-wrapped) model's state dict."""
    shape: tuple[int, ...]
    """The full, unsharded shape."""
    dtype: torch.dtype
    trainable: bool
    gather: Callable[[], torch.Tensor | None]
    """A collective: every rank calls it, in list order; rank 0 gets the full tensor, others None."""


def named_state_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters (a tied one once, under its first name, as `save_pretrained` keeps it), then the
    persistent buffers: what a Hugging Face checkpoint holds."""
    yield from module.named_parameters()
    for name, buffer in module.named_buffers():
        owner, _, leaf = name.rpartition(".")
        if leaf not in module.get_submodule(owner)._non_persistent_buffers_set:
            yield name, buffer


class Strategy(abc.ABC):
    """One model, optimizer and LR schedule, distributed one way. Every rank calls every method."""

    name: str
    model: nn.Module
    """The module to call for forward passes (wrapped as the strategy needs)."""
    scheduler: LRScheduler
    """The LR schedule (`optim.build_scheduler`), stepped once per optimizer step."""
    loss_chunk_tokens = LOSS_CHUNK_TOKENS
    """Positions whose logits `loss_sum` computes at once."""
    reshardable_checkpoints = True
    """Whether `load` accepts a checkpoint written by a different number of workers."""
    compile_failures: CompileFailures | None = None
    """Set when the strategy compiled its blocks (training.compile): what failed to compile."""
    attention = "sdpa"
    """The model's attention kernel (`model.use_packed_attention`), set where the model is built;
    `collate` pads flex_attention's rows to one length."""

    def __init__(
        self, config: TrainerConfig, env: WorkerEnv, total_steps: int, initial_weights: bool = True
    ) -> None:
        """`initial_weights=False` when a checkpoint will be loaded next: the pretrained (or seeded)
        weights are then not read at all, except a LoRA base, which checkpoints do not hold."""
        self.config = config
        self.env = env
        self.total_steps = total_steps
        self.dtype = compute_dtype(config.training.precision, env)
        self.lora = config.method.type == "lora"
        self.initial_weights = initial_weights or self.lora

    def process_groups(self) -> list[dist.ProcessGroup]:
        """The strategy's own process groups besides the default one (an HSDP mesh's), whose
        timeout follows the default group's."""
        return []

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits for a micro-batch already on the device.

        Packed examples come with `position_ids` and no attention mask: the model then keeps
        attention inside each example (see `data.collate`)."""
        logits: torch.Tensor = self._call(batch).logits
        return logits

    def _call(self, batch: dict[str, torch.Tensor]) -> Any:
        """The model's forward on a micro-batch (inputs, mask, positions; no KV cache)."""
        return self.model(
            input_ids=batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            position_ids=batch.get("position_ids"),
            use_cache=False,
        )

    def loss_sum(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Summed next-token loss of a micro-batch already on the device (`loss.token_loss_sum`).

        Taken in chunks of positions from the final hidden states (`loss.head_loss_forward`), so a
        large vocabulary's logits never exist whole; architectures that transform the head's
        output first fall back to whole logits."""
        lm = causal_lm(self.model)
        if lm is None:
            return token_loss_sum(self.forward(batch), batch["labels"])
        with head_loss_forward(lm, batch["labels"], self.loss_chunk_tokens):
            loss: torch.Tensor = self._call(batch).loss
        return loss

    def forward_backward(
        self, batch: dict[str, torch.Tensor], loss_scale: float, last_micro_batch: bool
    ) -> torch.Tensor:
        """Forward and backward one micro-batch; return its summed token loss (detached).

        The gradient is that of `loss_scale × summed loss`: the loop picks the scale so that, after
        the strategy averages gradients over ranks, they equal those of the mean loss over every
        trained token of the whole step, however the tokens are spread over ranks and micro-batches.
        """
        with self._sync_context(last_micro_batch):
            with self._autocast():
                loss_sum = self.loss_sum(batch)
            self._backward(loss_sum * loss_scale, last_micro_batch)
        return loss_sum.detach()

    def _sync_context(self, last_micro_batch: bool) -> AbstractContextManager[object]:
        return nullcontext()

    def _autocast(self) -> AbstractContextManager[object]:
        return nullcontext()

    @abc.abstractmethod
    def _backward(self, loss: torch.Tensor, last_micro_batch: bool) -> None:
        """Accumulate gradients; reduce them across ranks on the last micro-batch of a step."""

    @abc.abstractmethod
    def step(self) -> torch.Tensor | float | None:
        """Clip, update, advance the schedule, clear gradients; return the gradient norm.

        A tensor norm (possibly a DTensor) stays on the device: the loop reads it with
        `scalar()` only when it logs, to avoid a host-device sync on every step."""

    @property
    @abc.abstractmethod
    def learning_rate(self) -> float: ...

    @abc.abstractmethod
    def save(self, directory: Path) -> None:
        """Write this rank's share of model, optimizer and schedule state (all ranks call it)."""

    def start_save(self, directory: Path) -> Future[Any]:
        """Begin `save`; the future completes when this rank's share is on disk (and raises if the
        write failed). Synchronous here; FSDP2 and DDP write in the background with
        checkpoint.asyncSave. Every rank calls it, and waits for the future before the next one."""
        self.save(directory)
        done: Future[Any] = Future()
        done.set_result(None)
        return done

    @abc.abstractmethod
    def load(self, directory: Path, weights_only: bool = False) -> None:
        """Restore what `save` wrote, resharding where the strategy can; `weights_only` keeps the
        fresh optimizer and LR schedule (a seed checkpoint)."""

    @abc.abstractmethod
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Gather all the full weights on CPU at once: the dict on rank 0, None elsewhere (tests)."""

    @abc.abstractmethod
    def export_tensors(self) -> list[ExportTensor]:
        """The model's tensors, each gathered only when asked: the export streams them one by one,
        so no rank ever holds more than one full tensor (export.py)."""

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)
