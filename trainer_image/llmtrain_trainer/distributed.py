"""Where a training process sits among its peers, and the rank-aware helpers its pieces share.

Each worker builds one `WorkerEnv` (`from_ray_context` inside Ray Train; `from_torchrun` reads the
variables torchrun sets, for a one-process or torchrun launch) and hands it to the strategy and
the checkpoint code; the helpers here are collectives, so every rank must reach them together.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig


@dataclass(frozen=True)
class WorkerEnv:
    """Where this training process sits: its rank, the world and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @classmethod
    def from_ray_context(cls) -> WorkerEnv:
        """This Ray Train worker's place and device (its GPU made the current CUDA device)."""
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        device = ray.train.torch.get_device()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return cls(context.get_world_rank(), context.get_world_size(), context.get_local_rank(), device)

    @classmethod
    def from_torchrun(cls, use_gpu: bool) -> WorkerEnv:
        """The place torchrun gives a process (RANK, WORLD_SIZE, LOCAL_RANK; a lone process
        without them is rank 0 of 1)."""
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank) if use_gpu else torch.device("cpu")
        if use_gpu:
            torch.cuda.set_device(device)
        return cls(
            int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), local_rank, device
        )

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@contextmanager
def rank_zero_first(env: WorkerEnv) -> Iterator[None]:
    """Rank 0 runs the block first (filling caches on the shared storage), then the others.

    The block is a first download or tokenisation, which can take longer than any sensible
    collective timeout, so the others wait in a barrier that has none (`wait_for_all_ranks`)."""
    if not env.is_main:
        wait_for_all_ranks()
    yield
    if env.is_main:
        wait_for_all_ranks()


def wait_for_all_ranks() -> None:
    """A barrier outside the process group: inside Ray Train, its synchronisation actor's (no
    timeout; it logs every minute which ranks it still waits for, and a rank that dies fails the
    worker group); elsewhere (a bare process group, launch.py) torch's. A Ray Train worker has
    imported ray.train before it runs the loop, so without it Ray is never imported here."""
    if sys.modules.get("ray.train") is not None:
        import ray.train
        from ray.train.collective import barrier

        try:
            ray.train.get_context()
        except RuntimeError:  # not a Ray Train worker
            pass
        else:
            barrier()
            return
    dist.barrier()


def scalar(value: torch.Tensor | float) -> float:
    """A Python float from a (D)Tensor; for a DTensor, a collective every rank must reach."""
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)


def training_timeout_seconds(config: TrainerConfig) -> int:
    """The collective timeout once training runs: network.stepTimeoutSeconds when it is shorter
    than the start-up timeout (which must also cover first downloads, tokenisation and loading)."""
    step = config.network.step_timeout_seconds
    return (
        min(step, config.collective_timeout_seconds)
        if step is not None
        else config.collective_timeout_seconds
    )


def apply_training_timeout(config: TrainerConfig, groups: Sequence[dist.ProcessGroup] = ()) -> bool:
    """Shorten the timeout of the default process group and of the strategy's own `groups` (an
    HSDP mesh's; gloo and NCCL take a new one after init). Returns whether anything changed.

    A collective (every rank calls it after the same step): a barrier under the start-up timeout
    first, so no rank runs the next step's collectives on the short timeout while another is still
    in a slow first step (compilation, first allocations)."""
    seconds = training_timeout_seconds(config)
    if seconds >= config.collective_timeout_seconds:
        return False
    dist.barrier()
    if dist.get_backend() == "nccl":
        torch.cuda.synchronize()  # NCCL's barrier returns before it has completed on the device
    set_group_timeouts(seconds, groups)
    return True


def set_group_timeouts(
    seconds: int, groups: Sequence[dist.ProcessGroup] = (), default_group: bool = True
) -> None:
    """Set the timeout of `groups` (this rank's groups of a device mesh) and of the default group."""
    timeout = timedelta(seconds=seconds)
    if default_group:
        _set_pg_timeout(timeout)
    for group in groups:
        _set_pg_timeout(timeout, group)
