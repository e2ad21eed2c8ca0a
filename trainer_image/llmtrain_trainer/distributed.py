"""Where a training process sits among its peers, and the rank-aware helpers its pieces share.

The loop builds one `WorkerEnv` per worker and hands it to the strategy and the checkpoint code;
the helpers here are collectives, so every rank must reach them together.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class WorkerEnv:
    """Where this training process sits: its rank, the world and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@contextmanager
def rank_zero_first(env: WorkerEnv) -> Iterator[None]:
    """Rank 0 runs the block first (filling caches on the shared storage), then the others."""
    if not env.is_main:
        dist.barrier()
    yield
    if env.is_main:
        dist.barrier()


def scalar(value: torch.Tensor | float) -> float:
    """A Python float from a (D)Tensor; for a DTensor, a collective every rank must reach."""
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)
