"""Trainer entrypoint: TrainerConfig → Ray Train V2 `TorchTrainer` → exit code.

In the cluster the RayJob runs `python -m llmtrain_trainer.main --config
/etc/llmtrain/trainer-config.json` on the Ray head; `llmtrain run` calls `run_training` on a local
Ray instance. The run name and storage path come from the config and are stable per job, so a
worker failure (FailureConfig), a RayJob retry on a new cluster and a local re-run all resume from
the latest checkpoint.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.constants import RAY_VERSION_ENV

from llmtrain_trainer.config import DEFAULT_CONFIG_PATH, ConfigError, load_current_config
from llmtrain_trainer.hubpush import push_destinations
from llmtrain_trainer.kube_progress import report_export, report_failure
from llmtrain_trainer.loop import LoopOptions, loop_config, train_loop_per_worker
from llmtrain_trainer.objstore import ObjectStoreError, stage_inputs
from llmtrain_trainer.preflight import PreflightError, check
from llmtrain_trainer.ray_version import RayVersionMismatch, check_ray_version
from llmtrain_trainer.run_context import ranks_by_val_loss
from llmtrain_trainer.run_logs import RunLogHandler, attach_driver, detach, note
from llmtrain_trainer.rundir import latest_checkpoint
from llmtrain_trainer.weights import with_model_folder

if TYPE_CHECKING:
    from ray.train import CheckpointConfig

log = logging.getLogger("llmtrain_trainer")
PROG = "llmtrain-trainer"


class TrainingError(RuntimeError):
    """Training ran and failed; the message is a one-line reason."""


def worker_env_vars(config: TrainerConfig) -> dict[str, str]:
    """Variables every training worker needs, whatever the Ray cluster's own environment.

    Secrets (HF_TOKEN) are deliberately not forwarded: a runtime_env is visible in Ray's dashboard,
    and the worker pods get them from secretKeyRefs anyway (local workers inherit the environment).
    """
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if not config.scaling.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed must not probe for CUDA on CPU workers
    return env


def process_group_backend(config: TrainerConfig) -> str | None:
    """None lets Ray pick (NCCL on GPUs, gloo on CPUs). FSDP CPU offload on GPUs adds gloo for
    CPU tensors: its sharded gradients live on the CPU, where gradient clipping reduces them."""
    fsdp = config.strategy.fsdp
    offload = config.strategy.type == "fsdp" and fsdp is not None and fsdp.cpu_offload
    return "cpu:gloo,cuda:nccl" if offload and config.scaling.use_gpu else None


def build_trainer(config: TrainerConfig, options: LoopOptions | None = None) -> object:
    """The V2 TorchTrainer for this config (not started)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources: dict[str, float] = {"CPU": config.scaling.cpus_per_worker}
    if config.scaling.use_gpu:
        resources["GPU"] = 1
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config(config, options),
        torch_config=TorchConfig(
            backend=process_group_backend(config), timeout_s=config.collective_timeout_seconds
        ),
        scaling_config=ScalingConfig(
            num_workers=config.scaling.num_workers,
            use_gpu=config.scaling.use_gpu,
            resources_per_worker=resources,
        ),
        # ray.train.RunConfig is the V2 class at runtime (Ray Train V2 is the default); its static
        # type is still the V1 one, which lacks worker_runtime_env.
        run_config=RunConfig(  # type: ignore[call-arg]
            name=config.run_name,
            storage_path=config.storage_path,
            failure_config=FailureConfig(max_failures=config.max_worker_failures),
            checkpoint_config=checkpoint_config(config),
            worker_runtime_env={"env_vars": worker_env_vars(config)},
        ),
    )


def checkpoint_config(config: TrainerConfig) -> CheckpointConfig:
    """Ray Train's rotation: the newest `keep`, or the `keep` lowest validation losses (Ray
    always keeps the latest too, which a restart resumes from)."""
    from ray.train import CheckpointConfig

    if ranks_by_val_loss(config):
        return CheckpointConfig(
            num_to_keep=config.checkpoint.keep,
            checkpoint_score_attribute="val_loss",
            checkpoint_score_order="min",
        )
    return CheckpointConfig(num_to_keep=config.checkpoint.keep)


def root_cause(exc: BaseException) -> str:
    """'<ErrorClass> on rank <r>: <message>' for the operator's status message (e.g. an
    OutOfMemoryError or an NCCL timeout on one rank), unwrapping Ray's task-error wrapper."""
    failures = getattr(exc, "worker_failures", None)
    if failures:
        rank = min(failures)
        error = failures[rank]
        inner = getattr(error, "cause", None) or error.__cause__ or error
        return f"{type(inner).__name__} on rank {rank}: {_last_line(inner)}"
    return f"{type(exc).__name__}: {_last_line(exc)}"


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def run_training(config: TrainerConfig, options: LoopOptions | None = None) -> None:
    """Fit on the connected Ray cluster; raise TrainingError with a one-line reason on failure."""
    from ray.train import TrainingFailedError

    trainer = build_trainer(config, options)
    try:
        trainer.fit()  # type: ignore[attr-defined]
    except TrainingFailedError as exc:
        raise TrainingError(root_cause(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Run an llmtrain TrainerConfig with Ray Train.")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="TrainerConfig JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = with_model_folder(load_current_config(args.config))
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    saved = attach_driver(Path(config.run_dir))  # the pod log's copy on the shared storage
    try:
        return _run(config, saved)
    except BaseException:
        log.exception("the trainer's driver failed")
        raise
    finally:
        detach(saved)


def _run(config: TrainerConfig, handler: RunLogHandler | None) -> int:
    try:
        # Object URIs become local copies on the shared storage, once, before any worker starts.
        config = stage_inputs(config, resuming=latest_checkpoint(Path(config.run_dir)) is not None)
    except ObjectStoreError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        note(handler, f"{PROG}: error: {exc}")
        report_failure(config, str(exc))
        return 1  # may be passing (the store down): a RayJob retry tries again
    try:
        check(config)
    except PreflightError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        note(handler, f"{PROG}: error: {exc}")
        report_failure(config, str(exc))  # e.g. a bad trainer.custom.function, in the job status
        return 2

    import ray

    try:
        if warning := check_ray_version(os.environ.get(RAY_VERSION_ENV), ray.__version__):
            log.warning("%s", warning)
    except RayVersionMismatch as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        note(handler, f"{PROG}: error: {exc}")
        report_failure(config, str(exc))  # in the job status, with the field to fix
        return 2
    if not ray.is_initialized():
        ray.init()  # joins the cluster named by RAY_ADDRESS (the RayJob's), else starts a local one
    log.info("run %s: %d workers, storage %s", config.run_name, config.scaling.num_workers, config.run_dir)
    try:
        run_training(config)
    except TrainingError as exc:
        print(f"{PROG}: error: training failed: {exc}", file=sys.stderr)
        note(handler, f"{PROG}: error: training failed: {exc}")
        report_failure(config, str(exc))  # the operator shows it in the job status
        return 1
    log.info(
        "run %s finished; export in %s",
        config.run_name,
        config.export_dir if config.checkpoint.export else "-",
    )
    return publish_export(config, handler)


def publish_export(config: TrainerConfig, handler: RunLogHandler | None) -> int:
    """Push the finished export to checkpoint.exportTo and checkpoint.pushToHub (each once,
    retried) and report where it went. Each destination is tried even when the other failed, and
    what succeeded is reported; a failure fails the driver with the reason in status.progress.error
    (the trained export stays on the shared storage; a retry of the job pushes again, without
    training again, and skips the destination already done)."""
    uri, hub_commit, errors = push_destinations(config)
    report_export(config, uri, hub_commit)
    if errors:
        message = "; ".join(errors)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        note(handler, f"{PROG}: error: {message}")
        report_failure(config, message)
        return 1
    return 0


def exit_now(code: int) -> NoReturn:
    """End the driver process with `code` as the interpreter would, less its final teardown.

    After the atexit handlers, an exiting interpreter frees every module it imported: for the
    driver's torch, transformers and Ray that is one long garbage collection (3.5 to 9.7 s on a
    busy 2-CPU machine, after training has ended, against 0.2 s without it) that frees nothing the
    operating system would not. So this does what comes before it, in the interpreter's order:
    wait for non-daemon threads, run the atexit handlers (Ray's shutdown, which disconnects from
    the cluster; logging's flush; temporary files), flush stdout and stderr; then it exits at once.
    An exception out of `main` still takes the interpreter's own way out, traceback and all.
    """
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a reader gone: nothing to flush to
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
