"""TrainerConfig: the contract between the renderer (or `llmtrain run`) and the trainer.

The operator renders it into the job's ConfigMap; the trainer image and local mode parse it with
this same model, so no field is read by name from a raw dict. It reuses the spec's own models for
everything the user wrote and adds what only the renderer knows (resolved paths, run name, scale).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pydantic import Field

from llmtrain.api.base import ApiModel
from llmtrain.api.object_storage import ObjectStorageSpec
from llmtrain.api.spec import (
    CheckpointSpec,
    DatasetSpec,
    MethodSpec,
    ModelSpec,
    NetworkSpec,
    StrategySpec,
    TrainingSpec,
)
from llmtrain.api.tracking import TrackingSpec
from llmtrain.api.trainer_spec import TrainerSpec
from llmtrain.constants import EXPORT_DIR, PROGRESS_INTERVAL_SECONDS


class JobRef(ApiModel):
    """The LLMTrainingJob this run belongs to (for progress reports and log lines)."""

    name: str
    namespace: str = "default"


class ScalingSpec(ApiModel):
    """How many Ray Train workers, and what each one reserves."""

    num_workers: int = Field(ge=1, description="Training processes (one per GPU, or per CPU worker).")
    use_gpu: bool = False
    cpus_per_worker: float = Field(default=1.0, gt=0)
    devices_per_worker: int = Field(default=1, ge=1, description="Training processes per worker pod.")
    device_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        description="One device's memory (the GPU's, or a CPU worker pod's limit) for the memory "
        "estimate in preflight; unknown when None.",
    )


class ProgressSpec(ApiModel):
    """Where rank 0 reports live progress; disabled outside a cluster."""

    report_to_kubernetes: bool = False
    interval_seconds: float = Field(default=PROGRESS_INTERVAL_SECONDS, gt=0)


class ResumeSource(ApiModel):
    """spec.resumeFrom with its paths resolved; the trainer finds the checkpoint (resume_from.py)."""

    runs_root: str = Field(description="Where this namespace's runs live: <runs_root>/<job name>/<run id>.")
    run: str | None = Field(default=None, description="'<job name>/<run id>' or '<run id>' to continue.")
    checkpoint: str | None = Field(default=None, description="Absolute checkpoint directory to seed from.")


class TrainerConfig(ApiModel):
    job: JobRef
    run_name: str = Field(
        description="Ray Train RunConfig(name), the run id: the job's uid, so every restart of the job "
        "resumes and a re-created job under the same name does not."
    )
    storage_path: str = Field(
        description="Ray Train RunConfig(storage_path): shared, same path on every node; the job's "
        "folder holding its runs."
    )
    paths_base: str | None = Field(
        default=None,
        description="Where the spec's relative paths resolve: storage.mountPath in a cluster, the job "
        "file's folder locally. model.name is ambiguous ('org/model' is a hub id or a folder); the "
        "trainer's driver looks for a folder of that name here once, before any worker starts, so "
        "every process agrees on what it loads.",
    )
    resume_from: ResumeSource | None = None
    scaling: ScalingSpec
    max_worker_failures: int = Field(default=0, ge=-1)
    collective_timeout_seconds: int = Field(default=1800, ge=1)
    model: ModelSpec
    dataset: DatasetSpec
    method: MethodSpec = Field(default_factory=MethodSpec)
    strategy: StrategySpec = Field(default_factory=StrategySpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    progress: ProgressSpec = Field(default_factory=ProgressSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    object_storage: ObjectStorageSpec | None = Field(
        default=None,
        description="spec.objectStorage: the stores' endpoints, region and account (the environment's "
        "AWS_ENDPOINT_URL and AWS_REGION win); credentials only ever come from the environment.",
    )
    tracking: TrackingSpec | None = Field(
        default=None, description="spec.tracking: the trackers rank 0 sends metrics and config to."
    )
    network: NetworkSpec = Field(
        default_factory=NetworkSpec,
        description="The job's NCCL settings: the workers check at start-up that NCCL found the "
        "fabric of the infiniband and efa profiles.",
    )

    @property
    def run_dir(self) -> PurePosixPath:
        """Where Ray Train keeps this run's checkpoints: <storage_path>/<run_name>."""
        return PurePosixPath(self.storage_path) / self.run_name

    @property
    def export_dir(self) -> PurePosixPath:
        """The Hugging Face export, beside (not inside) the reported checkpoint chain."""
        return self.run_dir / EXPORT_DIR
