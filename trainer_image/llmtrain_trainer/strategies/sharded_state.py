"""Checkpoint and export helpers for torch-native strategies (FSDP2 and DDP), built on DCP.

`torch.distributed.checkpoint` writes one file per rank plus shared metadata and reshards on load,
so a run can resume on a different number of workers. The LR schedule and the fp16 loss scaler are
tiny, the same on every rank, and saved by rank 0.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, async_save, save
from torch.optim.lr_scheduler import LRScheduler

from llmtrain_trainer.rundir import write_durably

SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"
"""fp16's GradScaler state (scale, growth tracker): without it a resumed run restarts at 2**16 and
skips its first steps as overflows while the LR schedule advances."""


def _save_small_state(scheduler: LRScheduler, scaler: torch.amp.GradScaler | None, directory: Path) -> None:
    """Rank 0's files: the schedule, and the loss scaler's state under fp16."""
    schedule = scheduler.state_dict()
    write_durably(directory / SCHEDULER_FILE, lambda file: torch.save(schedule, file))
    if scaler is not None:
        scaling = scaler.state_dict()
        write_durably(directory / SCALER_FILE, lambda file: torch.save(scaling, file))


def _load_scaler(scaler: torch.amp.GradScaler | None, directory: Path) -> None:
    """The saved scale, when this run scales (fp16) and the checkpoint has one; a checkpoint from
    another precision (or from before scalers were saved) leaves the scaler's initial state."""
    path = directory / SCALER_FILE
    if scaler is not None and path.exists():
        scaler.load_state_dict(torch.load(path, weights_only=False))


def save_training_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    directory: Path,
    is_main: bool,
    options: StateDictOptions,
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """Every rank writes its shards of model and optimizer (DCP fsyncs them); rank 0 adds the
    schedule and the loss scaler."""
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory))
    if is_main:
        _save_small_state(scheduler, scaler, directory)


def start_training_state_save(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    directory: Path,
    is_main: bool,
    options: StateDictOptions,
    process_group: dist.ProcessGroup,
    scaler: torch.amp.GradScaler | None = None,
) -> Future[Any]:
    """`save_training_state` in the background: DCP copies this rank's shards to host memory before
    returning (training may then change the parameters), and a thread writes them. The future
    completes once this rank's files and, across `process_group`, the metadata are on disk.

    `process_group` must be a gloo group of its own: the writing thread's collectives would
    otherwise interleave with the training step's on the default group."""
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if is_main:
        # The writing thread has not necessarily created the directory yet.
        directory.mkdir(parents=True, exist_ok=True)
        _save_small_state(scheduler, scaler, directory)
    response = async_save(
        {"model": model_state, "optimizer": optim_state},
        checkpoint_id=str(directory),
        process_group=process_group,
        async_checkpointer_type=AsyncCheckpointerType.THREAD,
    )
    # The default stager copies synchronously, so async_save returns the upload future itself.
    assert isinstance(response, Future), type(response)
    return response


def load_training_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    directory: Path,
    options: StateDictOptions,
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """Read what `save_training_state` wrote into this rank's shards (resharding as needed)."""
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    load(state, checkpoint_id=str(directory))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=options,
    )
    scheduler.load_state_dict(torch.load(directory / SCHEDULER_FILE, weights_only=False))
    _load_scaler(scaler, directory)


def load_model_state(model: nn.Module, directory: Path, options: StateDictOptions) -> None:
    """Only the model's shards of what `save_training_state` wrote (DCP reads just these keys)."""
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=options)}
    load(state, checkpoint_id=str(directory))
    set_model_state_dict(model, state["model"], options=options)


def gather_full_state(model: nn.Module, is_main: bool) -> dict[str, torch.Tensor] | None:
    """All ranks take part; rank 0 receives the unsharded weights on CPU, one tensor at a time."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], state) if is_main else None
