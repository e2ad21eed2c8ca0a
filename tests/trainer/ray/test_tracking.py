"""spec.tracking end to end, against real trackers: an MLflow tracking server (PyPI `mlflow`,
started here on 127.0.0.1 with a sqlite store), W&B in offline mode (its run files, read back with
W&B's record protobufs) and TensorBoard (TensorBoard's own event reader).

The runs are jobs loaded the way `llmtrain run` loads them (the spec's tracking block reaches the
TrainerConfig through the same renderer) and trained with Ray Train on 2 CPU workers, so that only
rank 0 sending is checked too (one tracker run, one value per step). The built-in loop's run sends
every metric through its progress sinks; the Hugging Face mode's Trainer logs through its own
`report_to` into the same tracker runs. The MFU (None on CPUs) is checked through the sinks with
records that carry one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.local import load_job_config
from llmtrain_trainer.main import run_training
from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.progress import open_sinks
from llmtrain_trainer.tracking import tensorboard_dir

from tests.support.tracking import (
    mlflow_history,
    mlflow_runs,
    mlflow_server,
    once_per_step,
    tensorboard_scalars,
    wandb_offline_history,
    wandb_offline_runs,
)
from tests.support.trainer import REPO, losses, records, result, tiny_config

pytestmark = pytest.mark.slow

STEPS, EVERY = 12, 6


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def tracked_job(example: str, folder: Path, mlflow_url: str, experiment: str, **spec: Any) -> TrainerConfig:
    """The example with every tracker on, shortened, loaded as `llmtrain run` loads a job file."""
    document = yaml.safe_load((REPO / "examples" / example).read_text())
    document["spec"]["training"].update(maxSteps=STEPS, logEverySteps=1)
    document["spec"]["checkpoint"].update(everySteps=EVERY, export=False)
    document["spec"]["dataset"]["path"] = str(REPO / "examples" / document["spec"]["dataset"]["path"])
    document["spec"]["dataset"]["maxSeqLength"] = 64
    document["spec"]["tracking"] = {
        "runName": f"{experiment}-run",
        "mlflow": {"trackingUri": mlflow_url, "experiment": experiment},
        "wandb": {"project": "llmtrain-tests", "mode": "offline"},
        "tensorboard": {},
    }
    document["spec"].update(spec)
    job_file = folder / f"{experiment}.yaml"
    job_file.write_text(yaml.safe_dump(document))
    return load_job_config(job_file, folder / "runs", use_gpu=False)


def wandb_series(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """Step → value of one key of W&B history rows, plotted against train/global_step."""
    return once_per_step([(row["train/global_step"], row[key]) for row in rows if key in row])


def by_step(values: dict[int, float]) -> dict[int, Any]:
    return {step: pytest.approx(value, rel=1e-6) for step, value in values.items()}


def test_the_mlflow_sink_sends_every_metric_and_the_config_and_a_retry_continues_its_run(
    mlflow_url: str, tmp_path: Path
) -> None:
    """Records that carry an MFU (GPU runs do) through rank 0's real sinks; a second attempt of
    the same run (a retry, a resumed local run with a raised maxSteps) continues the one MLflow run."""
    tracking = {"mlflow": {"trackingUri": mlflow_url, "experiment": "sinks"}}
    steps = [
        MetricsRecord(
            "step",
            s,
            4,
            loss=3.0 - s / 10,
            learning_rate=1e-3 * s,
            grad_norm=s / 2,
            tokens_per_second=900.0 + s,
            mfu=0.3 + s / 100,
        )
        for s in (1, 2, 3, 4)
    ]
    for attempt, (maxsteps, chunk) in enumerate([(2, steps[:2]), (4, steps[2:])]):
        config = tiny_config(tmp_path, "sinks", tracking=tracking, training={"maxSteps": maxsteps})
        sinks = open_sinks(config, Path(config.run_dir), log_lines=False)
        for record in chunk:
            sinks.emit(record)
        if attempt == 1:
            sinks.emit(MetricsRecord("validation", 4, 4, val_loss=2.5))
            sinks.emit(MetricsRecord("finished", 4, 4))
        sinks.close()
    (run,) = mlflow_runs(mlflow_url, "sinks")
    assert run.info.status == "FINISHED"
    for name, field in [
        ("loss", "loss"),
        ("learning_rate", "learning_rate"),
        ("grad_norm", "grad_norm"),
        ("tokens_per_second", "tokens_per_second"),
        ("mfu", "mfu"),
    ]:
        assert mlflow_history(mlflow_url, run.info.run_id, name) == by_step(
            {r.step: getattr(r, field) for r in steps}
        ), name
    assert mlflow_history(mlflow_url, run.info.run_id, "eval_loss") == {4: 2.5}
    params = run.data.params
    assert params["training.maxSteps"] == "2"  # MLflow keeps a run's first values
    assert params["model.tokenizer"] == "byte-level" and params["runName"] == "sinks"


OPEN_AND_CLOSE_SINKS = """
import logging, sys
from pathlib import Path
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.progress import open_sinks

logging.basicConfig(level=logging.INFO)
config = TrainerConfig.model_validate_json(Path(sys.argv[1]).read_text())
open_sinks(config, Path(config.run_dir), log_lines=False).close()
"""


def test_mlflow_sink_opens_without_a_git_warning_where_git_is_absent(mlflow_url: str, tmp_path: Path) -> None:
    """The trainer image has no git: MLflow's GitPython import would log "Failed to import Git ...
    Bad git executable" on every run, unless the tracking module quiets GitPython first. A fresh
    process (GitPython decides at its first import) opens and closes the sinks with no git on PATH."""
    config = tiny_config(
        tmp_path, "no-vcs", tracking={"mlflow": {"trackingUri": mlflow_url, "experiment": "no-vcs"}}
    )
    config_file = tmp_path / "config.json"
    config_file.write_text(config.model_dump_json(by_alias=True))
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_PYTHON")}
    env["PATH"] = str(empty)
    done = subprocess.run(
        [sys.executable, "-c", OPEN_AND_CLOSE_SINKS, str(config_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "git executable" not in output.lower() and "import git" not in output.lower(), output
    (run,) = mlflow_runs(mlflow_url, "no-vcs")  # the sink did reach MLflow
    assert run.info.status == "FAILED"  # closed before a "finished" record


def test_a_builtin_run_reaches_mlflow_wandb_and_tensorboard_from_rank_0_only(
    ray_address: str, mlflow_url: str, tmp_path: Path
) -> None:
    config = tracked_job(
        "tiny-cpu.yaml",
        tmp_path,
        mlflow_url,
        "builtin",
        dataset={
            "path": str(REPO / "examples" / "data" / "tiny-stories.txt"),
            "format": "text",
            "maxSeqLength": 64,
            "validationSplit": 0.1,
        },
    )
    run_training(config, LoopOptions(log_lines=False))
    assert result(config)["steps"] == STEPS
    trained = losses(config)
    assert sorted(trained) == list(range(1, STEPS + 1))
    steps = {r.step: r for r in records(config) if r.event == "step"}
    validations = {r.step: r.val_loss for r in records(config) if r.event == "validation"}
    assert sorted(validations) == [EVERY, STEPS]

    (run,) = mlflow_runs(mlflow_url, "builtin")  # one run: rank 1 sent nothing
    assert run.info.status == "FINISHED" and run.info.run_name == "builtin-run"
    run_id = run.info.run_id
    assert mlflow_history(mlflow_url, run_id, "loss") == by_step(trained)
    for name in ("learning_rate", "grad_norm", "tokens_per_second"):
        sent = {s: getattr(r, name) for s, r in steps.items() if getattr(r, name) is not None}
        assert len(sent) >= STEPS - 1, name  # tokens/s from the second record on
        assert mlflow_history(mlflow_url, run_id, name) == by_step(sent), name
    assert mlflow_history(mlflow_url, run_id, "eval_loss") == by_step(validations)
    assert run.data.params["training.maxSteps"] == str(STEPS)
    assert run.data.params["dataset.validationSplit"] == "0.1"

    scalars = tensorboard_scalars(tensorboard_dir(Path(config.run_dir)))
    assert once_per_step(scalars["train/loss"]) == by_step(trained)
    assert once_per_step(scalars["eval/loss"]) == by_step(validations)
    assert set(range(2, STEPS + 1)) <= set(once_per_step(scalars["train/tokens_per_second"])) <= set(trained)

    (run_file,) = wandb_offline_runs(Path(config.run_dir))
    rows, wandb_config = wandb_offline_history(run_file)
    assert wandb_series(rows, "train/loss") == by_step(trained)
    assert wandb_series(rows, "eval/loss") == by_step(validations)
    assert wandb_config["llmtrain"]["training"]["maxSteps"] == STEPS


def test_the_hf_mode_logs_through_its_own_report_to_into_the_same_tracker_runs(
    ray_address: str, mlflow_url: str, tmp_path: Path
) -> None:
    """The Trainer's integrations log its loss and TrainingArguments into the runs rank 0's sinks
    opened (one run per tracker), and the sinks add tokens/s and the llmtrain config."""
    config = tracked_job("tiny-cpu-hf.yaml", tmp_path, mlflow_url, "hf")
    run_training(config, LoopOptions(log_lines=False))
    trained = losses(config)
    assert sorted(trained) == list(range(1, STEPS + 1))

    (run,) = mlflow_runs(mlflow_url, "hf")
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert mlflow_history(mlflow_url, run_id, "loss") == by_step(trained)  # the Trainer's own log
    # tokens/s, by the sink, from the second record on (the first has no interval to measure)
    assert set(range(2, STEPS + 1)) <= set(mlflow_history(mlflow_url, run_id, "tokens_per_second"))
    params = run.data.params
    assert params["per_device_train_batch_size"] == "8"  # TrainingArguments, by the integration
    assert params["trainer.type"] == "huggingface"  # the llmtrain config, by the sink

    scalars = tensorboard_scalars(tensorboard_dir(Path(config.run_dir)))
    assert once_per_step(scalars["train/loss"]) == by_step(trained)
    assert set(range(2, STEPS + 1)) <= set(once_per_step(scalars["train/tokens_per_second"]))

    (run_file,) = wandb_offline_runs(Path(config.run_dir))
    rows, wandb_config = wandb_offline_history(run_file)
    assert {r["train/global_step"]: r["train/loss"] for r in rows if "train/loss" in r} == by_step(trained)
    assert set(range(2, STEPS + 1)) <= {
        r["train/global_step"] for r in rows if "train/tokens_per_second" in r
    }
    assert wandb_config["per_device_train_batch_size"] == 8 and "llmtrain" in wandb_config


def test_a_custom_function_s_reports_reach_the_trackers(
    ray_address: str, mlflow_url: str, tmp_path: Path
) -> None:
    """The user's `ctx.report` goes through the same sinks: the loss and learning rate it reports."""
    config = tracked_job(
        "tiny-cpu-custom.yaml",
        tmp_path,
        mlflow_url,
        "custom",
        trainer={
            "type": "custom",
            "custom": {"function": "tiny_train:train", "path": str(REPO / "examples" / "custom")},
        },
        tracking={"mlflow": {"trackingUri": mlflow_url, "experiment": "custom"}, "tensorboard": {}},
    )
    run_training(config, LoopOptions(log_lines=False))
    trained = losses(config)
    assert sorted(trained) == list(range(1, STEPS + 1))

    (run,) = mlflow_runs(mlflow_url, "custom")
    assert run.info.status == "FINISHED"
    assert mlflow_history(mlflow_url, run.info.run_id, "loss") == by_step(trained)
    rate = config.training.learning_rate
    assert mlflow_history(mlflow_url, run.info.run_id, "learning_rate") == {
        s: pytest.approx(rate) for s in trained
    }
    assert params_of(run)["trainer.custom.function"] == "tiny_train:train"
    scalars = tensorboard_scalars(tensorboard_dir(Path(config.run_dir)))
    assert once_per_step(scalars["train/loss"]) == by_step(trained)


def params_of(run: Any) -> dict[str, str]:
    params: dict[str, str] = run.data.params
    return params
