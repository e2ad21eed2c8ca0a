"""spec.tracking: where rank 0 also sends the run's metrics and config (MLflow, W&B, TensorBoard).

The trainer's tracking sinks (llmtrain_trainer/tracking.py) read these models; credentials never
appear in them, only Secret references that the renderer turns into `secretKeyRef` variables of the
Ray containers (MLFLOW_TRACKING_TOKEN, WANDB_API_KEY), which the trackers' own clients read.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from llmtrain.api.base import ApiModel, SecretKeyRef, cel

# An http(s) URL: the trainer talks to the tracking server over HTTP, never to a local file store
# (which would be each pod's own disk).
HTTP_URL = r"^https?://[^\s/?#]+([/?#]\S*)?$"
# W&B project and entity names: no path separators or URL delimiters.
WANDB_NAME = r"^[^/\\#?%:\s]{1,128}$"

# The variables the trackers' clients read their credentials from (see `TrackingSpec.secret_env`).
MLFLOW_TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
WANDB_API_KEY_ENV = "WANDB_API_KEY"
# The run directory's TensorBoard folder (events of every attempt of the run).
TENSORBOARD_DIR = "tensorboard"


class MlflowTracking(ApiModel):
    """An MLflow tracking server: one MLflow run per llmtrain run, resumed by a retry."""

    tracking_uri: Annotated[str, Field(pattern=HTTP_URL, max_length=2048)] = Field(
        description="The tracking server's http(s) URL, e.g. http://mlflow.mlflow.svc:5000."
    )
    experiment: Annotated[str, Field(min_length=1, max_length=500)] | None = Field(
        default=None, description="MLflow experiment name; created if missing. Defaults to the job's name."
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a bearer token for the server; injected as "
        "MLFLOW_TRACKING_TOKEN through secretKeyRef only. For basic auth, give "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in network.env with valueFrom.",
    )


class WandbTracking(ApiModel):
    """Weights & Biases: one W&B run per llmtrain run (its id is the run id, so a retry resumes it)."""

    project: Annotated[str, Field(pattern=WANDB_NAME)] = Field(description="W&B project.")
    entity: Annotated[str, Field(pattern=WANDB_NAME)] | None = Field(
        default=None, description="W&B entity (user or team); defaults to the API key's default entity."
    )
    base_url: Annotated[str, Field(pattern=HTTP_URL, max_length=2048)] | None = Field(
        default=None, description="A self-hosted W&B server's URL; defaults to W&B's cloud."
    )
    mode: Literal["online", "offline"] = Field(
        default="online",
        description="online sends as it trains; offline writes the run's files under <run dir>/wandb "
        "on the shared storage, to upload later with `wandb sync` (no network, no API key).",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the W&B API key; injected as WANDB_API_KEY through "
        "secretKeyRef only. Required by W&B in online mode.",
    )


class TensorBoardTracking(ApiModel):
    """TensorBoard event files in <run dir>/tensorboard on the shared storage (`tensorboard
    --logdir` on that folder, or on the job's folder to compare its runs)."""


class TrackingSpec(ApiModel):
    """Experiment tracking: rank 0 sends loss, learning rate, gradient norm, tokens/s, MFU and
    evaluation loss, and the run's config, to each tracker set here, in every trainer mode."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.mlflow) || has(self.wandb) || has(self.tensorboard)",
                    "tracking needs at least one of tracking.mlflow, tracking.wandb or "
                    "tracking.tensorboard; remove tracking to track nothing",
                ),
            ]
        }
    )

    run_name: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        default=None, description="The run's display name in the trackers; defaults to the job's name."
    )
    mlflow: MlflowTracking | None = Field(default=None, description="Send to an MLflow tracking server.")
    wandb: WandbTracking | None = Field(default=None, description="Send to Weights & Biases.")
    tensorboard: TensorBoardTracking | None = Field(
        default=None, description="Write TensorBoard event files to <run dir>/tensorboard."
    )

    def backends(self) -> list[str]:
        """The trackers set, by the names transformers' `report_to` knows them."""
        names = [("mlflow", self.mlflow), ("wandb", self.wandb), ("tensorboard", self.tensorboard)]
        return [name for name, block in names if block is not None]

    def secret_env(self) -> dict[str, SecretKeyRef]:
        """Variable → Secret key: the credentials the Ray containers get through secretKeyRef."""
        env: dict[str, SecretKeyRef] = {}
        if self.mlflow is not None and self.mlflow.token_secret_ref is not None:
            env[MLFLOW_TOKEN_ENV] = self.mlflow.token_secret_ref
        if self.wandb is not None and self.wandb.api_key_secret_ref is not None:
            env[WANDB_API_KEY_ENV] = self.wandb.api_key_secret_ref
        return env
