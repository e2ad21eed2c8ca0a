"""Stop a run hard after a checkpoint, start a second trainer process with the same run name and
storage (what a RayJob retry does), and check it resumes where the first left off.

The first process is a separate driver killed with SIGKILL (its whole process group) once a
checkpoint is registered; the second one is started the same way as the RayJob entrypoint.
Both join the session's Ray instance through RAY_ADDRESS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training

from tests.support.trainer import losses, records, result, tiny_config, write_config

pytestmark = pytest.mark.slow

STEPS, EVERY = 40, 10
# Same data order, same RNG state, same world size and fp32 on CPU: the resumed trajectory should
# equal the uninterrupted one up to float rounding in the collectives.
LOSS_TOLERANCE = 1e-4


@dataclass(frozen=True)
class ResumeOutcome:
    reference: TrainerConfig
    resumed: TrainerConfig
    checkpoint_at_kill: int
    last_step_before_kill: int
    second_log: str


def _driver(config_file: Path, ray_address: str) -> list[str]:
    return [sys.executable, "-m", "llmtrain_trainer.main", "--config", str(config_file)]


def _env(ray_address: str) -> dict[str, str]:
    return {**os.environ, "RAY_ADDRESS": ray_address}


def _wait_for_checkpoint(config: TrainerConfig, process: subprocess.Popen[bytes], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [r.step for r in records(config) if r.event == "checkpoint"]
        if steps:
            return steps[-1]
        if process.poll() is not None:
            raise AssertionError(f"the first trainer exited with {process.returncode} before a checkpoint")
        time.sleep(0.05)
    raise AssertionError("no checkpoint within the timeout")


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def outcome(
    request: pytest.FixtureRequest, ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> ResumeOutcome:
    """Both ways of saving (checkpoint.asyncSave): an async checkpoint is registered, and so can be
    resumed from, only once it is written, when the next one starts or training ends."""
    storage = tmp_path_factory.mktemp("resume")
    overrides = {
        "training": {"maxSteps": STEPS},
        "checkpoint": {"everySteps": EVERY, "asyncSave": request.param},
    }
    reference = tiny_config(storage, "uninterrupted", **overrides)
    run_training(reference, LoopOptions(log_lines=False))

    resumed = tiny_config(storage, "interrupted", **overrides)
    config_file = write_config(resumed, storage / "interrupted.json")
    first = subprocess.Popen(_driver(config_file, ray_address), env=_env(ray_address), start_new_session=True)
    try:
        checkpoint = _wait_for_checkpoint(resumed, first, timeout=300)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    last_step = max(r.step for r in records(resumed) if r.event == "step")
    assert last_step < STEPS, "the first trainer finished before it could be stopped"

    second = subprocess.run(
        _driver(config_file, ray_address), env=_env(ray_address), capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stderr[-3000:]
    return ResumeOutcome(reference, resumed, checkpoint, last_step, second.stdout + second.stderr)


def test_resume_continues_at_checkpoint_and_matches_uninterrupted_run(outcome: ResumeOutcome) -> None:
    resumed_at = result(outcome.resumed)["resumed_from_step"]
    assert resumed_at is not None and resumed_at % EVERY == 0
    assert outcome.checkpoint_at_kill <= resumed_at < STEPS
    # The second process's first step is the one after the checkpoint.
    events = records(outcome.resumed)
    resume_index = max(i for i, r in enumerate(events) if r.event == "resumed")
    after = [r.step for r in events[resume_index:] if r.event == "step"]
    assert after == list(range(resumed_at + 1, STEPS + 1))

    expected, actual = losses(outcome.reference), losses(outcome.resumed)
    assert sorted(actual) == sorted(expected) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert actual[step] == pytest.approx(expected[step], abs=LOSS_TOLERANCE), step


def test_second_trainer_process_resumes_instead_of_restarting(outcome: ResumeOutcome) -> None:
    done = result(outcome.resumed)
    assert done["finished"] and done["steps"] == STEPS
    assert done["resumed_from_step"] >= EVERY
    assert f"resumed at step {done['resumed_from_step']}" in outcome.second_log
    started = [r for r in records(outcome.resumed) if r.event == "started"]
    assert len(started) == 1, "only the first process started from scratch"


def test_an_async_checkpoint_is_registered_after_training_went_on(outcome: ResumeOutcome) -> None:
    """With asyncSave the step after a checkpoint runs before the checkpoint counts (its write
    overlapped training); a synchronous one counts before the next step."""
    events = records(outcome.reference)
    first = next(i for i, r in enumerate(events) if r.event == "checkpoint")
    assert events[first].step == EVERY
    steps_before = [r.step for r in events[:first] if r.event == "step"]
    if outcome.reference.checkpoint.async_save:
        assert max(steps_before) == 2 * EVERY
    else:
        assert max(steps_before) == EVERY
