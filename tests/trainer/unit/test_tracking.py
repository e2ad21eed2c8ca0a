"""spec.tracking without Ray: rank 0's sinks write real TensorBoard event files (read back with
TensorBoard's own reader), the Hugging Face mode leaves the Trainer's metrics to its own
`report_to`, and tracker run ids are stable. The MLflow server and W&B runs are in
tests/trainer/ray/test_tracking.py (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmtrain.api.spec import LLMTrainingJobSpec
from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.modes.hf_args import training_arguments
from llmtrain_trainer.progress import open_sinks
from llmtrain_trainer.tracking import run_identity, tensorboard_dir
from pydantic import ValidationError

from tests.support.jobs import minimal_job
from tests.support.tracking import once_per_step, tensorboard_scalars, tensorboard_texts
from tests.support.trainer import tiny_config

STEPS = [
    MetricsRecord(
        "step",
        s,
        3,
        loss=3.0 - s / 10,
        learning_rate=1e-3 * s,
        grad_norm=0.5 + s,
        tokens_per_second=900.0 + s,
        mfu=0.3 + s / 100,
    )
    for s in (1, 2, 3)
]
VALIDATION = MetricsRecord("validation", 3, 3, val_loss=2.25)


def emit_run(config_dir: Path, **overrides: object) -> Path:
    """A run's records through rank 0's real sinks (as the lifecycle opens them); its directory."""
    config = tiny_config(config_dir, "tb", tracking={"tensorboard": {}}, **overrides)
    run_dir = Path(config.run_dir)
    sinks = open_sinks(config, run_dir, log_lines=False)
    sinks.emit(MetricsRecord("started", 0, 3))
    for record in [*STEPS, VALIDATION]:
        sinks.emit(record)
    sinks.emit(MetricsRecord("checkpoint", 3, 3, path="x"))
    sinks.emit(MetricsRecord("finished", 3, 3))
    sinks.close()
    return run_dir


def test_tensorboard_gets_every_tracked_metric_and_the_config_on_the_shared_storage(tmp_path: Path) -> None:
    run_dir = emit_run(tmp_path)
    scalars = tensorboard_scalars(tensorboard_dir(run_dir))
    expected = {
        "train/loss": "loss",
        "train/learning_rate": "learning_rate",
        "train/grad_norm": "grad_norm",
        "train/tokens_per_second": "tokens_per_second",
        "train/mfu": "mfu",
    }
    assert set(scalars) == {*expected, "eval/loss"}
    for tag, field in expected.items():
        assert once_per_step(scalars[tag]) == {r.step: pytest.approx(getattr(r, field)) for r in STEPS}, tag
    assert once_per_step(scalars["eval/loss"]) == {3: pytest.approx(2.25)}
    config = tensorboard_texts(tensorboard_dir(run_dir))["llmtrain/config"]
    assert '"maxSteps": 30' in config and '"runName": "tb"' in config


def test_in_the_hf_mode_the_sinks_add_only_what_the_trainer_does_not_log(tmp_path: Path) -> None:
    """transformers' own report_to integration logs loss, learning rate, gradient norm and the
    evaluation loss into the same folder; the sink adds tokens/s and MFU, never a second loss."""
    run_dir = emit_run(tmp_path, trainer={"type": "huggingface"}, strategy={"type": "ddp"})
    assert set(tensorboard_scalars(tensorboard_dir(run_dir))) == {"train/tokens_per_second", "train/mfu"}


def test_the_hf_mode_reports_to_the_spec_trackers_and_only_through_spec_tracking(tmp_path: Path) -> None:
    hf = {"trainer": {"type": "huggingface"}, "strategy": {"type": "ddp"}}
    tracked = tiny_config(
        tmp_path, "hf", tracking={"mlflow": {"trackingUri": "http://m:5000"}, "tensorboard": {}}, **hf
    )
    assert training_arguments(tracked, tmp_path / "out", evaluate=False).report_to == [
        "mlflow",
        "tensorboard",
    ]
    assert (
        training_arguments(tiny_config(tmp_path, "hf", **hf), tmp_path / "out", evaluate=False).report_to
        == []
    )  # "none"
    job = minimal_job()
    job["spec"]["trainer"] = {"type": "huggingface", "huggingface": {"args": {"report_to": "wandb"}}}
    with pytest.raises(ValidationError, match="report_to"):
        LLMTrainingJobSpec.model_validate(job["spec"])


def test_a_run_keeps_one_tracker_identity_across_attempts_and_within_wandb_limits(tmp_path: Path) -> None:
    first = tiny_config(tmp_path, "a", job={"name": "job", "namespace": "team"})
    assert run_identity(first) == run_identity(
        tiny_config(tmp_path, "a", job={"name": "job", "namespace": "team"})
    )
    assert run_identity(first) != run_identity(
        tiny_config(tmp_path, "b", job={"name": "job", "namespace": "team"})
    )
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    long = tiny_config(
        tmp_path, uid, job={"name": "a-job-name-of-forty-seven-characters-abcdefghij", "namespace": "ns"}
    )
    identity = run_identity(long)
    assert len(identity) <= 64 and identity.replace("-", "").replace("_", "").isalnum()
