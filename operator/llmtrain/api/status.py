"""The LLMTrainingJob status: written by the operator, except `progress`, which the trainer owns."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from llmtrain.api.base import ApiModel

Phase = Literal["Pending", "Initializing", "Running", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[Phase, ...] = ("Pending", "Initializing", "Running", "Succeeded", "Failed", "Suspended")


class Condition(ApiModel):
    """metav1.Condition."""

    type: str = Field(max_length=316, description="Condition type, e.g. Running or Succeeded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    reason: str = Field(max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")


class CheckpointRef(ApiModel):
    """The latest checkpoint the trainer reported."""

    path: str = Field(max_length=4096, description="Checkpoint directory on the shared storage.")
    step: int = Field(ge=0, description="Optimizer step the checkpoint holds.")
    seconds: float | None = Field(
        default=None,
        ge=0,
        description="Seconds training paused for it (the save, and validation when configured); "
        "etaSeconds counts this for every checkpoint still to come.",
    )


# The longest root cause the trainer reports (status.progress.error).
ERROR_MAX_LENGTH = 4096
# status.progress.notices: at most this many, each at most this long.
NOTICES_MAX = 8
NOTICE_MAX_LENGTH = 512


class Progress(ApiModel):
    """Live training figures, patched by the trainer's rank 0 through the status subresource
    (`llmtrain_trainer.kube_progress` builds them with this model, so the wire form is this one)."""

    step: int | None = Field(default=None, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, ge=0, description="Optimizer steps planned.")
    summary: str | None = Field(
        default=None, max_length=64, description="step/totalSteps, for the Progress column."
    )
    epoch: float | None = Field(default=None, ge=0, description="Fractional epoch.")
    loss: float | None = Field(default=None, description="Training loss, averaged since the last report.")
    learning_rate: float | None = Field(default=None, description="Current learning rate.")
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Training throughput, all workers."
    )
    mfu: float | None = Field(default=None, ge=0, description="Model FLOPs utilisation (0-1), when known.")
    eta_seconds: int | None = Field(default=None, ge=0, description="Estimated seconds to the end.")
    last_checkpoint: CheckpointRef | None = Field(default=None, description="Latest checkpoint.")
    eval_loss: float | None = Field(
        default=None, description="Validation loss of the latest evaluation (training.evalEverySteps)."
    )
    eval_step: int | None = Field(default=None, ge=0, description="Step of the latest evaluation.")
    best_eval_loss: float | None = Field(
        default=None,
        description="Lowest validation loss so far (an improvement beats it by more than "
        "training.earlyStopping.minDelta), over every evaluation.",
    )
    best_step: int | None = Field(default=None, ge=0, description="Step of bestEvalLoss.")
    error: str | None = Field(
        default=None,
        max_length=ERROR_MAX_LENGTH,
        description="Root cause reported by the trainer, e.g. rank and error class.",
    )
    exported_to: str | None = Field(
        default=None,
        max_length=1024,
        description="The object-store URI the finished export was copied to (checkpoint.exportTo); "
        "a failed copy shows in error instead.",
    )
    pushed_to_hub: str | None = Field(
        default=None,
        max_length=1024,
        description="The Hub commit the finished export was uploaded in (checkpoint.pushToHub), as "
        "its URL (<endpoint>/<repo>/commit/<sha>); a failed push shows in error instead.",
    )
    updated_at: str | None = Field(default=None, description="When the trainer last reported (RFC 3339).")
    notices: list[Annotated[str, Field(max_length=NOTICE_MAX_LENGTH)]] | None = Field(
        default=None,
        max_length=NOTICES_MAX,
        description="What the trainer wants you to know that did not stop it, e.g. that torch.compile "
        "fell back to eager for some blocks (training.compile).",
    )

    def to_patch(self) -> dict[str, Any]:
        """status.progress as a merge patch: camelCase, with the fields never set left out and a field
        set to None kept as null, which deletes it (a cleared root cause must reach the server)."""
        data: dict[str, Any] = self.model_dump(by_alias=True, exclude_unset=True, mode="json")
        return data


class LLMTrainingJobStatus(ApiModel):
    """Observed state."""

    # Kopf keeps its bookkeeping in status.kopf (see llmtrain.operator.settings); the schema must
    # keep unknown fields there or the API server would prune them.
    model_config = ConfigDict(extra="allow")

    phase: Phase | None = Field(
        default=None, description="Pending, Initializing, Running, Succeeded, Failed or Suspended."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Latest observations (Created, Running, Succeeded, Failed, Suspended, InvalidSpec, "
        "StartupBlocked: what keeps the Ray cluster from starting).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="Generation last acted on.")
    ray_job_name: str | None = Field(default=None, description="The RayJob running this job.")
    ray_cluster_name: str | None = Field(default=None, description="The current Ray cluster.")
    dashboard_url: str | None = Field(
        default=None, alias="dashboardURL", description="Ray dashboard address."
    )
    start_time: str | None = Field(default=None, description="When the RayJob started (RFC 3339).")
    completion_time: str | None = Field(default=None, description="When the RayJob finished (RFC 3339).")
    retries: int | None = Field(
        default=None,
        ge=0,
        description="Retries on a new Ray cluster so far, each resuming from the latest checkpoint.",
    )
    message: str | None = Field(default=None, description="Why the job is in its phase.")
    progress: Progress | None = Field(default=None, description="Live training progress (trainer-owned).")
