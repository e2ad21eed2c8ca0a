"""spec.tracking's progress sinks: rank 0's records to MLflow, Weights & Biases and TensorBoard.

They are ordinary `ProgressSink`s (progress.py), opened by `open_sinks` next to `metrics.jsonl`, so
the built-in loop, the custom function's `report` and the Hugging Face mode's log callback reach
them through the same records, and only rank 0 (which alone opens sinks) sends anything.

Names follow what transformers' own integrations log to each tracker, so runs of every trainer mode
line up in one experiment: MLflow gets `loss`, `learning_rate`, `grad_norm`, `eval_loss`, ...; W&B
and TensorBoard get `train/loss`, `eval/loss`, ... In the Hugging Face mode the Trainer's own
`report_to` integration logs its metrics and its TrainingArguments into the same tracker run (the
sink opens the run first, and the integration joins it); the sink then adds only what the Trainer
does not measure (tokens/s, MFU) and the llmtrain config.

One llmtrain run is one tracker run: a retry or a resumed local run continues it (MLflow: the run
tagged with the llmtrain run; W&B: the run id derived from it; TensorBoard: the same folder).
Credentials come from the environment the trackers' clients read (MLFLOW_TRACKING_TOKEN,
WANDB_API_KEY), which the pods get through secretKeyRef only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmtrain.api.tracking import TENSORBOARD_DIR

from llmtrain_trainer.metrics import MetricsRecord

if TYPE_CHECKING:
    from llmtrain.api.trainer_config import TrainerConfig

    from llmtrain_trainer.progress import ProgressSink

log = logging.getLogger(__name__)

# MLflow imports GitPython to tag runs with a commit; without a git executable (the trainer image
# has none) GitPython's import fails and MLflow logs "Failed to import Git ... Bad git executable"
# on every run. Quiet makes the import succeed with no git: the runs just get no commit tag. Set
# here, before any mlflow import (the sinks import it lazily), not in the image's Dockerfile.
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

# Record field → the name transformers' MLflow integration uses (it logs the Trainer's keys as is).
MLFLOW_NAMES = {
    "loss": "loss",
    "learning_rate": "learning_rate",
    "grad_norm": "grad_norm",
    "epoch": "epoch",
    "val_loss": "eval_loss",
    "tokens_per_second": "tokens_per_second",
    "mfu": "mfu",
}
# Record field → the name transformers' W&B and TensorBoard integrations use (`rewrite_logs`).
PREFIXED_NAMES = {
    "loss": "train/loss",
    "learning_rate": "train/learning_rate",
    "grad_norm": "train/grad_norm",
    "epoch": "train/epoch",
    "val_loss": "eval/loss",
    "tokens_per_second": "train/tokens_per_second",
    "mfu": "train/mfu",
}
# What the Hugging Face Trainer's own report_to integration already logs in that mode.
HF_LOGGED = frozenset({"loss", "learning_rate", "grad_norm", "epoch", "val_loss"})
# The package each tracker needs in the trainer image (pyproject's [track] extra).
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard"}
# The step W&B plots against: the one transformers' W&B integration defines.
WANDB_STEP = "train/global_step"
RUN_TAG = "llmtrain.run"


def run_identity(config: TrainerConfig) -> str:
    """A stable id for this llmtrain run, <namespace>-<job>-<run id>, in W&B's id alphabet and
    length; a retry or a resumed run maps to the same id."""
    raw = f"{config.job.namespace}-{config.job.name}-{config.run_name}"
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "-", raw)
    if len(cleaned) <= 64:
        return cleaned
    return f"{cleaned[:47]}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def display_name(config: TrainerConfig) -> str:
    tracking = config.tracking
    return tracking.run_name if tracking is not None and tracking.run_name else config.job.name


def config_document(config: TrainerConfig) -> dict[str, Any]:
    """The run's config as the trackers get it: the TrainerConfig the job rendered (the spec with
    resolved paths, run name and scale). It holds Secret references, never secret values."""
    document: dict[str, Any] = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    return document


def flatten(document: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """`a.b.c` → value text, for trackers whose parameters are flat strings (MLflow)."""
    for key, value in document.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from flatten(value, f"{name}.")
        else:
            yield name, value if isinstance(value, str) else json.dumps(value)


def metric_values(record: MetricsRecord, names: dict[str, str], skip: frozenset[str]) -> dict[str, float]:
    """The record's tracked metrics under the tracker's names (steps and validations only)."""
    if record.event not in ("step", "validation"):
        return {}
    values: dict[str, float] = {}
    for field, name in names.items():
        value = getattr(record, field)
        if value is not None and field not in skip:
            values[name] = float(value)
    return values


class MlflowSink:
    """One MLflow run per llmtrain run, found again by its `llmtrain.run` tag on a retry. The run
    is also made the active (fluent) run, so transformers' MLflow integration logs into it."""

    def __init__(self, config: TrainerConfig, skip: frozenset[str]) -> None:
        import mlflow
        from mlflow import MlflowClient

        assert config.tracking is not None and config.tracking.mlflow is not None
        spec = config.tracking.mlflow
        self.skip = skip
        self.finished = False
        mlflow.set_tracking_uri(spec.tracking_uri)
        self.client = MlflowClient(spec.tracking_uri)
        experiment_name = spec.experiment or config.job.name
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(experiment_name)
        )
        identity = run_identity(config)
        earlier = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{identity}'", max_results=1
        )
        if earlier:
            run = mlflow.start_run(run_id=earlier[0].info.run_id)
            logged = set(earlier[0].data.params)
        else:
            run = mlflow.start_run(
                experiment_id=experiment_id,
                run_name=display_name(config),
                tags={RUN_TAG: identity, "llmtrain.job": f"{config.job.namespace}/{config.job.name}"},
            )
            logged = set()
        self.run_id = run.info.run_id
        # Parameters cannot change in MLflow: a resumed run (e.g. a raised maxSteps) keeps the
        # values its first attempt logged and adds only new ones.
        self._log_params({k: v for k, v in flatten(config_document(config)) if k not in logged})

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        items = [Param(k, v[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items()]
        for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + MAX_PARAMS_TAGS_PER_BATCH])

    def emit(self, record: MetricsRecord) -> None:
        from mlflow.entities import Metric

        if record.event == "finished":
            self.finished = True
        values = metric_values(record, MLFLOW_NAMES, self.skip)
        if values:
            stamp = int(record.time * 1000)
            metrics = [Metric(name, value, stamp, record.step) for name, value in values.items()]
            # Sent by MLflow's background thread: a slow server does not stall a training step.
            self.client.log_batch(self.run_id, metrics=metrics, synchronous=False)

    def close(self) -> None:
        import mlflow

        mlflow.flush_async_logging()
        status = "FINISHED" if self.finished else "FAILED"
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status)
        else:
            self.client.set_terminated(self.run_id, status)


class WandbSink:
    """One W&B run per llmtrain run (its id from `run_identity`, resumed by a retry), plotted
    against `train/global_step` as transformers' W&B integration plots; that integration finds
    this run already started (`wandb.run`) and logs into it."""

    def __init__(self, config: TrainerConfig, run_dir: Path, skip: frozenset[str]) -> None:
        import wandb

        assert config.tracking is not None and config.tracking.wandb is not None
        spec = config.tracking.wandb
        self.skip = skip
        self.finished = False
        settings: dict[str, Any] = {"console": "off", "silent": True}
        if spec.base_url is not None:
            settings["base_url"] = spec.base_url
        self.run = wandb.init(
            project=spec.project,
            entity=spec.entity,
            id=run_identity(config),
            name=display_name(config),
            resume="allow",
            mode=spec.mode,
            dir=str(run_dir),
            config={"llmtrain": config_document(config)},
            settings=wandb.Settings(**settings),
        )
        self.run.define_metric(WANDB_STEP)
        self.run.define_metric("*", step_metric=WANDB_STEP, step_sync=True)

    def emit(self, record: MetricsRecord) -> None:
        if record.event == "finished":
            self.finished = True
        values = metric_values(record, PREFIXED_NAMES, self.skip)
        if values:
            self.run.log({**values, WANDB_STEP: record.step})

    def close(self) -> None:
        self.run.finish(exit_code=0 if self.finished else 1)


class TensorBoardSink:
    """Event files in <run dir>/tensorboard, on the shared storage beside the checkpoints."""

    def __init__(self, config: TrainerConfig, run_dir: Path, skip: frozenset[str]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.skip = skip
        self.writer = SummaryWriter(log_dir=str(tensorboard_dir(run_dir)))
        text = json.dumps(config_document(config), indent=2)
        self.writer.add_text("llmtrain/config", f"```\n{text}\n```")

    def emit(self, record: MetricsRecord) -> None:
        for name, value in metric_values(record, PREFIXED_NAMES, self.skip).items():
            self.writer.add_scalar(name, value, global_step=record.step, walltime=record.time)

    def close(self) -> None:
        self.writer.close()


def tensorboard_dir(run_dir: Path) -> Path:
    return run_dir / TENSORBOARD_DIR


def missing_packages(config: TrainerConfig) -> list[str]:
    """The trackers whose client package the installed trainer lacks (for preflight)."""
    import importlib.util

    if config.tracking is None:
        return []
    return [name for name in config.tracking.backends() if importlib.util.find_spec(PACKAGES[name]) is None]


def tracking_sinks(config: TrainerConfig, run_dir: Path) -> list[ProgressSink]:
    """Rank 0's sinks for spec.tracking. A tracker that cannot be reached is logged and left out:
    training goes on, with metrics.jsonl and the job status still complete."""
    if config.tracking is None:
        return []
    skip = HF_LOGGED if config.trainer.type == "huggingface" else frozenset()
    openers: dict[str, Callable[[], ProgressSink]] = {
        "mlflow": lambda: MlflowSink(config, skip),
        "wandb": lambda: WandbSink(config, run_dir, skip),
        "tensorboard": lambda: TensorBoardSink(config, run_dir, skip),
    }
    sinks: list[ProgressSink] = []
    for name in config.tracking.backends():
        try:
            sinks.append(openers[name]())
        except Exception:
            log.exception("tracking: could not open %s; training goes on without it", name)
    return sinks
