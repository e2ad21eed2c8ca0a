"""Spec → TrainerConfig, for the cluster (rendered into the ConfigMap) and for `llmtrain run`."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from llmtrain.api.job import LLMTrainingJob
from llmtrain.api.trainer_config import JobRef, ProgressSpec, ScalingSpec, TrainerConfig
from llmtrain.quantity import cpu_cores


def run_storage_path(job: LLMTrainingJob) -> str:
    """<mountPath>/runs/<namespace>: with run_name = job name, every retry finds the same run."""
    return str(PurePosixPath(job.spec.storage.mount_path) / "runs" / job.metadata.namespace)


def _resolve(path: str, base: PurePosixPath | Path) -> str:
    return path if path.startswith("/") else str(base / path)


def _build(
    job: LLMTrainingJob,
    base: PurePosixPath | Path,
    storage_path: str,
    scaling: ScalingSpec,
    progress: ProgressSpec,
) -> TrainerConfig:
    """Everything the user wrote, with relative model and data paths resolved against `base`."""
    spec = job.spec
    model = spec.model
    if model.name and not _looks_like_hub_id(model.name):
        model = model.model_copy(update={"name": _resolve(model.name, base)})
    dataset = spec.dataset
    if dataset.path:
        dataset = dataset.model_copy(update={"path": _resolve(dataset.path, base)})
    return TrainerConfig(
        job=JobRef(name=job.metadata.name, namespace=job.metadata.namespace),
        run_name=job.metadata.name,
        storage_path=storage_path,
        scaling=scaling,
        max_worker_failures=spec.run_policy.max_worker_failures,
        collective_timeout_seconds=spec.network.collective_timeout_seconds,
        model=model,
        dataset=dataset,
        method=spec.method,
        strategy=spec.strategy,
        training=spec.training,
        checkpoint=spec.checkpoint,
        progress=progress,
        network=spec.network,
    )


def cluster_trainer_config(job: LLMTrainingJob, progress_interval_seconds: float = 15.0) -> TrainerConfig:
    res = job.spec.resources
    gpus = res.gpus_per_worker
    # One training process per GPU; a CPU worker pod runs one process using all its cores.
    scaling = ScalingSpec(
        num_workers=res.workers * max(gpus, 1),
        use_gpu=gpus > 0,
        cpus_per_worker=max(cpu_cores(res.cpu) / max(gpus, 1), 0.5),
    )
    return _build(
        job,
        PurePosixPath(job.spec.storage.mount_path),
        run_storage_path(job),
        scaling,
        ProgressSpec(report_to_kubernetes=True, interval_seconds=progress_interval_seconds),
    )


def local_trainer_config(
    job: LLMTrainingJob, job_file_dir: Path, runs_root: Path, use_gpu: bool = False
) -> TrainerConfig:
    """The same job on this machine: relative data paths resolve against the job file's folder and
    the run lives in <runs_root>/<name>, so running it again resumes."""
    res = job.spec.resources
    num_workers = res.workers * (max(res.gpus_per_worker, 1) if use_gpu else 1)
    return _build(
        job,
        job_file_dir.resolve(),
        str(runs_root.resolve()),
        ScalingSpec(num_workers=num_workers, use_gpu=use_gpu, cpus_per_worker=1.0),
        ProgressSpec(report_to_kubernetes=False),
    )


def _looks_like_hub_id(name: str) -> bool:
    """org/model (one slash, no leading dot or slash) is a hub id; anything else is a path."""
    return not name.startswith(("/", ".")) and name.count("/") <= 1 and not name.endswith("/")
