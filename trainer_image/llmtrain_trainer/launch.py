"""Run a TrainerConfig without Ray: one process, or one per rank under torchrun.

    python -m llmtrain_trainer.launch --config trainer-config.json
    torchrun --nproc-per-node N -m llmtrain_trainer.launch --config trainer-config.json

Each process runs the same worker code as a Ray Train worker (loop.run_worker: the lifecycle and
the mode), with its place read from torchrun's RANK, WORLD_SIZE and LOCAL_RANK (alone it is rank
0 of 1, with a file rendezvous of its own) and a `LocalRunContext` in place of Ray Train's: the
run directory's newest complete checkpoint is the resume point, and each checkpoint report keeps
the newest checkpoint.keep ones. So a launch resumes a run the Ray launch left and vice versa, and
a machine with torch and transformers but no Ray (a benchmark host, a laptop) can train or debug.
Ray is never imported. The trainer.type huggingface mode needs Ray Train's checkpoint callback and
is refused here. There are no worker restarts: a failed rank fails the launch (exit code 1), and
running it again resumes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from llmtrain.api.trainer_config import TrainerConfig

from llmtrain_trainer.config import ConfigError, load_config
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.loop import LoopOptions, run_worker
from llmtrain_trainer.main import process_group_backend, worker_env_vars
from llmtrain_trainer.preflight import PreflightError, check
from llmtrain_trainer.run_context import LocalRunContext, ranks_by_val_loss
from llmtrain_trainer.weights import with_model_folder

PROG = "python -m llmtrain_trainer.launch"
NEEDS_RAY = {
    "huggingface": "trainer.type huggingface registers its checkpoints through Ray Train's "
    "callback, so it needs Ray: run it with `llmtrain run` (without --no-ray) or in the cluster, "
    "or use trainer.type builtin here"
}
"""trainer.type → why this launch cannot run it."""


class LaunchError(RuntimeError):
    """The process cannot join a process group as launched; the message says how to launch it."""


@contextmanager
def process_group(config: TrainerConfig, env: WorkerEnv) -> Iterator[None]:
    """The default process group, as Ray Train's TorchConfig would make it (NCCL on GPUs, gloo on
    CPUs, both with FSDP CPU offload; the start-up collective timeout). torchrun names the
    rendezvous (MASTER_ADDR, MASTER_PORT); a lone process uses a file of its own."""
    if dist.is_initialized():
        yield
        return
    backend = process_group_backend(config) or ("nccl" if env.on_gpu else "gloo")
    timeout = timedelta(seconds=config.collective_timeout_seconds)
    scratch: str | None = None
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)  # env://, torchrun's
    elif env.world_size == 1:
        scratch = tempfile.mkdtemp(prefix="llmtrain-launch-")
        init_method = Path(scratch, "rendezvous").as_uri()
        dist.init_process_group(backend, init_method=init_method, rank=0, world_size=1, timeout=timeout)
    else:
        raise LaunchError(
            f"WORLD_SIZE is {env.world_size} but MASTER_ADDR is not set: start several processes "
            f"with torchrun --nproc-per-node N -m llmtrain_trainer.launch"
        )
    try:
        yield
    finally:
        dist.destroy_process_group()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def launch(config: TrainerConfig, options: LoopOptions) -> None:
    """Train this process's rank of `config`'s run (raises what the training raised)."""
    if reason := NEEDS_RAY.get(config.trainer.type):
        raise LaunchError(reason)
    for name, value in worker_env_vars(config).items():
        os.environ.setdefault(name, value)
    if "MASTER_ADDR" not in os.environ:  # a lone process: the place torchrun would give it
        for name in ("RANK", "LOCAL_RANK"):
            os.environ.setdefault(name, "0")  # DeepSpeed reads LOCAL_RANK itself
        os.environ.setdefault("WORLD_SIZE", "1")
    env = WorkerEnv.from_torchrun(config.scaling.use_gpu)
    if env.is_main and env.world_size != config.scaling.num_workers:
        logging.getLogger("llmtrain_trainer").info(
            "%d processes (scaling.numWorkers says %d; this launch trains with as many ranks as it started)",
            env.world_size,
            config.scaling.num_workers,
        )
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with process_group(config, env):
        run_worker(
            config, options, env, run_dir, LocalRunContext(config.checkpoint.keep, ranks_by_val_loss(config))
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train a TrainerConfig without Ray: one process, or one per rank under "
        "torchrun (torchrun --nproc-per-node N -m llmtrain_trainer.launch ...).",
    )
    parser.add_argument("--config", type=Path, required=True, help="TrainerConfig JSON file")
    parser.add_argument(
        "--no-log-lines", action="store_true", help="no log line per step (a progress bar reads them)"
    )
    parser.add_argument(
        "--no-checkpoint-at-end",
        action="store_true",
        help="no checkpoint of the final step off the checkpoint.everySteps grid (benchmarks)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = with_model_folder(load_config(args.config))
        if reason := NEEDS_RAY.get(config.trainer.type):
            raise LaunchError(reason)
        check(config)
    except (ConfigError, PreflightError, LaunchError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    options = LoopOptions(log_lines=not args.no_log_lines, checkpoint_at_end=not args.no_checkpoint_at_end)
    try:
        launch(config, options)
    except LaunchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # logged with its traceback by run_worker
        print(f"{PROG}: error: training failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
