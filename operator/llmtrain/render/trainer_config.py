"""Spec → TrainerConfig, for the cluster (rendered into the ConfigMap) and for `llmtrain run`.

A run lives in <runs root>/<job name>/<run id>. On a cluster the runs root is
<mountPath>/runs/<namespace> and the run id is the job's uid: a suspend, a RayJob retry or a worker
failure of the job finds its own run again, while a job deleted and re-created under the same name
(a new uid) starts a new one unless spec.resumeFrom says otherwise.
"""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath

from llmtrain.api.job import LLMTrainingJob
from llmtrain.api.object_storage import is_object_uri
from llmtrain.api.spec import MIN_CPUS_PER_PROCESS
from llmtrain.api.trainer_config import JobRef, ProgressSpec, ResumeSource, ScalingSpec, TrainerConfig
from llmtrain.constants import PROGRESS_INTERVAL_SECONDS
from llmtrain.memory import device_memory_bytes
from llmtrain.quantity import cpu_cores

# Ray counts resources in units of 1/10000 (ray._raylet.RESOURCE_UNIT_SCALING).
_RAY_RESOURCE_UNITS = 10_000

# The run id of a job rendered without a uid (`llmtrain render` of a file never stored by the API).
NO_UID_RUN_ID = "no-uid"


def runs_root(job: LLMTrainingJob) -> PurePosixPath:
    """<mountPath>/runs/<namespace>: every run of every job of the namespace lies below it."""
    return PurePosixPath(job.spec.storage.mount_path) / "runs" / job.metadata.namespace


def run_storage_path(job: LLMTrainingJob) -> str:
    """<runs root>/<job name>: the job's runs, one per uid (Ray Train's storage_path)."""
    return str(runs_root(job) / job.metadata.name)


def run_id(job: LLMTrainingJob) -> str:
    """The job's uid: stable across its restarts, new for a job re-created under the same name."""
    return job.metadata.uid or NO_UID_RUN_ID


def _resolve(path: str, base: PurePosixPath | Path) -> str:
    """An absolute path or an object URI as is; a relative path under `base`."""
    return path if path.startswith("/") or is_object_uri(path) else str(base / path)


def _build(
    job: LLMTrainingJob,
    base: PurePosixPath | Path,
    root: PurePosixPath | Path,
    name: str,
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
    if dataset.validation_path:
        dataset = dataset.model_copy(update={"validation_path": _resolve(dataset.validation_path, base)})
    trainer = spec.trainer
    if trainer.custom is not None and trainer.custom.path:
        custom = trainer.custom.model_copy(update={"path": _resolve(trainer.custom.path, base)})
        trainer = trainer.model_copy(update={"custom": custom})
    return TrainerConfig(
        job=JobRef(name=job.metadata.name, namespace=job.metadata.namespace),
        run_name=name,
        storage_path=str(root / job.metadata.name),
        paths_base=str(base),
        resume_from=_resume_source(job, base, root),
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
        trainer=trainer,
        tracking=spec.tracking,
        object_storage=spec.object_storage,
        network=spec.network,
    )


def _ray_cpus_per_process(cores: float, processes: int) -> float:
    """The Ray CPUs each training process reserves: its share of the ceil(cores) CPUs KubeRay gives
    the worker pod's Ray node, at least MIN_CPUS_PER_PROCESS. A share of the pod's own cores would
    let Ray pack another pod's processes there (at cpu 500m, both processes of a 2-worker job on one
    pod, found in real pods). The spec refuses cores below MIN_CPUS_PER_PROCESS x gpus, so the
    shares always fit; they are rounded down to Ray's resource unit (1e-4) so that Ray's
    fixed-point rounding cannot push their sum past the node's CPUs."""
    share = math.floor(math.ceil(cores) / processes * _RAY_RESOURCE_UNITS) / _RAY_RESOURCE_UNITS
    return max(share, MIN_CPUS_PER_PROCESS)


def cluster_trainer_config(
    job: LLMTrainingJob, progress_interval_seconds: float = PROGRESS_INTERVAL_SECONDS
) -> TrainerConfig:
    res = job.spec.resources
    scaling = ScalingSpec(
        num_workers=res.processes,
        use_gpu=res.gpus_per_worker > 0,
        cpus_per_worker=_ray_cpus_per_process(cpu_cores(res.cpu), res.processes_per_worker),
        devices_per_worker=res.processes_per_worker,
        device_memory_bytes=device_memory_bytes(res),
    )
    return _build(
        job,
        PurePosixPath(job.spec.storage.mount_path),
        runs_root(job),
        run_id(job),
        scaling,
        ProgressSpec(report_to_kubernetes=True, interval_seconds=progress_interval_seconds),
    )


def local_trainer_config(
    job: LLMTrainingJob,
    job_file_dir: Path,
    runs_dir: Path,
    use_gpu: bool = False,
    local_run_id: str = "local",
) -> TrainerConfig:
    """The same job on this machine: relative data paths resolve against the job file's folder and
    the run lives in <runs_dir>/<name>/<local_run_id> (`llmtrain run` passes the job file's stem),
    so running the same file again resumes. On the CPU, each worker pod becomes one process, as a
    job with gpusPerWorker 0 would."""
    res = job.spec.resources
    if not use_gpu:
        res = res.model_copy(update={"gpus_per_worker": 0})
    scaling = ScalingSpec(
        num_workers=res.processes,
        use_gpu=use_gpu,
        cpus_per_worker=1.0,
        devices_per_worker=res.processes_per_worker,
    )
    return _build(
        job,
        job_file_dir.resolve(),
        runs_dir.resolve(),
        local_run_id,
        scaling,
        ProgressSpec(report_to_kubernetes=False),
    )


def _resume_source(
    job: LLMTrainingJob, base: PurePosixPath | Path, root: PurePosixPath | Path
) -> ResumeSource | None:
    """spec.resumeFrom with its checkpoint path made absolute (the spec's rules keep it on storage)."""
    spec = job.spec.resume_from
    if spec is None:
        return None
    checkpoint = _resolve(spec.checkpoint, base) if spec.checkpoint else None
    return ResumeSource(runs_root=str(root), run=spec.run, checkpoint=checkpoint)


def _looks_like_hub_id(name: str) -> bool:
    """org/model (one slash, no leading dot or slash) is a hub id; anything else is a path."""
    return not name.startswith(("/", ".")) and name.count("/") <= 1 and not name.endswith("/")
