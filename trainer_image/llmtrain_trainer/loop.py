"""The per-worker entry point that Ray Train runs on every rank, whatever the trainer mode.

launch.py runs the same `run_worker` without Ray (one process, or one per torchrun rank). It sets
up the worker (logging, `WorkerEnv`, the fabric check), picks the mode registered for
spec.trainer.type (modes/) and runs it inside the run's lifecycle (lifecycle.py), which owns the
resume point, the records, checkpoint registration and the result.

The driver imports this module for `loop_config` and `train_loop_per_worker` (Ray pickles the
function by reference, and each worker imports the module). What only a worker runs (the
lifecycle, the modes, torch's collectives) is imported inside the functions, so the driver does
not pay for the training stack it never uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmtrain.api.trainer_config import TrainerConfig

from llmtrain_trainer.run_logs import attach_worker, detach

if TYPE_CHECKING:
    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.run_context import RunContext


@dataclass(frozen=True)
class LoopOptions:
    """Driver-side choices passed to the workers next to the TrainerConfig."""

    log_lines: bool = True
    """Print a log line per metrics record (off under `llmtrain run`, which draws a progress bar)."""
    checkpoint_at_end: bool = True
    """Checkpoint the final step even off the checkpoint.everySteps grid (throughput benchmarks
    turn it off: they do not need to write a multi-gigabyte optimizer state at the end)."""

    def to_dict(self) -> dict[str, Any]:
        return {"log_lines": self.log_lines, "checkpoint_at_end": self.checkpoint_at_end}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopOptions:
        return cls(
            log_lines=bool(data.get("log_lines", True)),
            checkpoint_at_end=bool(data.get("checkpoint_at_end", True)),
        )


def loop_config(config: TrainerConfig, options: LoopOptions | None = None, **extra: Any) -> dict[str, Any]:
    """What the driver hands every worker (Ray's `train_loop_config`): JSON only."""
    return {
        "trainer_config": config.model_dump(mode="json", by_alias=True),
        "options": (options or LoopOptions()).to_dict(),
        **extra,
    }


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: `loop_config` holds the TrainerConfig (JSON) and the LoopOptions."""
    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.run_context import RayRunContext

    config = TrainerConfig.model_validate(loop_config["trainer_config"])
    options = LoopOptions.from_dict(loop_config.get("options", {}))
    run_worker(config, options, WorkerEnv.from_ray_context(), RayRunContext.run_dir(), RayRunContext())


def run_worker(
    config: TrainerConfig, options: LoopOptions, env: WorkerEnv, run_dir: Path, context: RunContext
) -> None:
    """Train this rank's part of the run, whoever launched it (every rank calls it)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("llmtrain_trainer").setLevel(logging.INFO)
    import datasets

    from llmtrain_trainer.fabric_check import check_fabric, should_check
    from llmtrain_trainer.lifecycle import Lifecycle
    from llmtrain_trainer.modes import mode_for

    datasets.disable_progress_bars()
    saved = attach_worker(run_dir, env.rank)  # this rank's log, kept on the shared storage
    try:
        if should_check(config.network.nccl_profile, env.on_gpu):
            check_fabric(config.network, lambda: _first_collective(env))
        mode = mode_for(config.trainer.type)
        with Lifecycle(config, env, run_dir, options, mode, context) as lifecycle:
            mode.run(config, env, run_dir, lifecycle)
    except BaseException:
        logging.getLogger("llmtrain_trainer").exception("training failed on rank %d", env.rank)
        raise
    finally:
        detach(saved)


def _first_collective(env: WorkerEnv) -> None:
    """An all-reduce of one element: NCCL creates its communicator (and logs its transport)."""
    import torch
    import torch.distributed as dist

    probe = torch.ones(1, device=env.device)
    dist.all_reduce(probe)
    torch.cuda.synchronize(env.device)
