"""Run identity end to end: LLMTrainingJobs rendered by the operator's own renderer, with uids as
the API server gives them, trained by the trainer on the session's Ray instance.

A job deleted and re-created under the same name (a new uid) must start a new run at step 0 with a
fresh LR schedule; the same uid (a suspend, a retry) must resume its own run; `resumeFrom.run`
continues another run with all its state and `resumeFrom.checkpoint` takes only its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain.api.trainer_config import ProgressSpec, TrainerConfig
from llmtrain.api.validation import parse_job
from llmtrain.render.trainer_config import cluster_trainer_config
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training

from tests.support.trainer import REPO, TINY_STORIES, losses, records, result, run_dir

pytestmark = pytest.mark.slow

STEPS, EVERY = 6, 3
NAME, NAMESPACE = "story", "test"
LOSS_TOLERANCE = 1e-4


def job_config(mount: Path, name: str, uid: str, max_steps: int = STEPS, **spec: Any) -> TrainerConfig:
    """examples/tiny-cpu.yaml shrunk to a few steps, rendered as the operator renders it."""
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": NAMESPACE, "uid": uid}
    doc["spec"]["dataset"].update(path=str(TINY_STORIES), maxSeqLength=64)
    doc["spec"]["training"].update(maxSteps=max_steps, logEverySteps=1, warmupRatio=0.2)
    doc["spec"]["checkpoint"] = {"everySteps": EVERY, "keep": 3, "export": False}
    doc["spec"]["storage"]["mountPath"] = str(mount)
    doc["spec"].update(spec)
    config = cluster_trainer_config(parse_job(doc))
    return config.model_copy(update={"progress": ProgressSpec(report_to_kubernetes=False)})


def train(config: TrainerConfig) -> TrainerConfig:
    run_training(config, LoopOptions(log_lines=False))
    return config


def learning_rates(config: TrainerConfig) -> dict[int, float | None]:
    return {r.step: r.learning_rate for r in records(config) if r.event == "step"}


def events(config: TrainerConfig, kind: str) -> list[Any]:
    return [r for r in records(config) if r.event == kind]


@dataclass(frozen=True)
class Runs:
    first: TrainerConfig  # job "story", uid-a
    seeded: TrainerConfig  # resumeFrom.checkpoint: uid-a's last checkpoint
    continued: TrainerConfig  # resumeFrom.run: uid-a
    recreated: TrainerConfig  # job "story" again, uid-b
    same_uid: TrainerConfig  # job "story", uid-a again, with more steps


@pytest.fixture(scope="module")
def runs(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    mount = tmp_path_factory.mktemp("shared")
    first = train(job_config(mount, NAME, "uid-a"))
    last = f"runs/{NAMESPACE}/{NAME}/uid-a/checkpoint-step-{STEPS:08d}"
    seeded = train(job_config(mount, "seeded", "uid-s", resumeFrom={"checkpoint": last}))
    continued = train(job_config(mount, "continued", "uid-c", STEPS + EVERY, resumeFrom={"run": "uid-a"}))
    recreated = train(job_config(mount, NAME, "uid-b"))
    same_uid = train(job_config(mount, NAME, "uid-a", STEPS + EVERY))
    return Runs(first, seeded, continued, recreated, same_uid)


def test_a_job_recreated_under_the_same_name_starts_a_new_run(runs: Runs) -> None:
    assert run_dir(runs.recreated) != run_dir(runs.first)
    assert run_dir(runs.recreated).parent == run_dir(runs.first).parent  # both under runs/test/story/
    assert [r.step for r in events(runs.recreated, "started")] == [0]
    assert not events(runs.recreated, "resumed")
    assert sorted(losses(runs.recreated)) == list(range(1, STEPS + 1))
    # A fresh schedule and fresh weights: the same trajectory as the first job's.
    first_lr = learning_rates(runs.first)
    assert learning_rates(runs.recreated) == {s: first_lr[s] for s in range(1, STEPS + 1)}
    first_loss = losses(runs.first)
    for step, loss in losses(runs.recreated).items():
        assert loss == pytest.approx(first_loss[step], abs=LOSS_TOLERANCE), step


def test_the_same_uid_resumes_its_own_run(runs: Runs) -> None:
    assert run_dir(runs.same_uid) == run_dir(runs.first)
    assert result(runs.same_uid)["resumed_from_step"] == STEPS
    assert len(events(runs.same_uid, "started")) == 1
    resumed = events(runs.same_uid, "resumed")
    assert [r.step for r in resumed] == [STEPS]


def test_resume_from_run_continues_its_weights_optimizer_and_schedule(runs: Runs) -> None:
    resumed = events(runs.continued, "resumed")
    assert [r.step for r in resumed] == [STEPS] and "from run uid-a" in (resumed[0].message or "")
    assert not events(runs.continued, "started")
    assert sorted(losses(runs.continued)) == list(range(STEPS + 1, STEPS + EVERY + 1))
    # The same continuation as the old job's own resume: same state, same data position.
    own = losses(runs.same_uid)
    for step, loss in losses(runs.continued).items():
        assert loss == pytest.approx(own[step], abs=LOSS_TOLERANCE), step
    assert learning_rates(runs.continued) == {
        s: learning_rates(runs.same_uid)[s] for s in range(STEPS + 1, STEPS + EVERY + 1)
    }
    # Its checkpoints are its own; the old run is only read.
    assert (run_dir(runs.continued) / f"checkpoint-step-{STEPS + EVERY:08d}").is_dir()
    assert run_dir(runs.continued) == run_dir(runs.first).parents[1] / "continued" / "uid-c"


def test_resume_from_checkpoint_takes_the_weights_with_a_fresh_schedule(runs: Runs) -> None:
    started = events(runs.seeded, "started")
    assert [r.step for r in started] == [0] and "from checkpoint" in (started[0].message or "")
    assert sorted(losses(runs.seeded)) == list(range(1, STEPS + 1))
    first_lr = learning_rates(runs.first)
    assert learning_rates(runs.seeded) == {s: first_lr[s] for s in range(1, STEPS + 1)}
    # Trained weights: the first batch's loss is that of the trained model, not of a random one.
    first_loss, seeded_loss = losses(runs.first), losses(runs.seeded)
    assert seeded_loss[1] < first_loss[1] - 0.5
    assert seeded_loss[1] < first_loss[STEPS] + 0.2
    assert result(runs.seeded)["resume_from"].startswith("checkpoint ")


def test_each_rank_saved_its_log_with_both_attempts(runs: Runs) -> None:
    """run_logs.py under Ray Train: uid-a's two attempts (6 steps, then resumed for 3 more) each
    appended to every rank's `logs/worker-<rank>.log`, the resume's restore line after the second
    separator."""
    logs = run_dir(runs.first) / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["worker-0.log", "worker-1.log"]
    for rank in (0, 1):
        text = (logs / f"worker-{rank}.log").read_text()
        attempts = text.split(f"===== worker rank {rank} attempt started ")
        assert len(attempts) == 3 and not attempts[0], text[:2000]
        assert "restoring step" not in attempts[1], attempts[1][-2000:]
        assert f"restoring step {STEPS} from" in attempts[2], attempts[2][-2000:]
