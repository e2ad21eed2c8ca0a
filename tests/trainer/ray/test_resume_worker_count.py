"""A run checkpointed by 2 FSDP2 workers resumes on 1 (what an elastic restart after a lost node
does): DCP reshards model and optimizer, the data position and token count carry over, and the loss
continues from where it was rather than from the start. (DeepSpeed refuses another worker count
with a message saying how to resume: tests/trainer/unit/test_checkpoint_files.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import TrainingError, run_training

from tests.support.trainer import records, result, run_killing_a_worker, tiny_config

pytestmark = pytest.mark.slow

STEPS, EVERY = 30, 10


@pytest.mark.timeout(900)
def test_fsdp_checkpoint_from_two_workers_resumes_on_one(ray_address: str, storage: Path) -> None:
    overrides = {"training": {"maxSteps": STEPS}, "checkpoint": {"everySteps": EVERY}}
    two = tiny_config(storage, "reshard", **overrides)
    killed: dict[str, int] = {}
    with pytest.raises(TrainingError):  # no failures allowed: the run stops
        run_killing_a_worker(two, killed)
    assert killed, "no worker was killed"
    before = {r.step: r for r in records(two) if r.event == "step"}

    one = tiny_config(storage, "reshard", scaling={"numWorkers": 1}, **overrides)
    run_training(one, LoopOptions(log_lines=False))

    done = result(one)
    resumed_at = done["resumed_from_step"]
    assert done["finished"] and done["world_size"] == 1
    assert resumed_at is not None and killed["checkpoint"] <= resumed_at < STEPS and resumed_at % EVERY == 0
    events = records(one)
    resume_index = max(i for i, r in enumerate(events) if r.event == "resumed")
    after = {r.step: r for r in events[resume_index:] if r.event == "step"}
    assert sorted(after) == list(range(resumed_at + 1, STEPS + 1))
    # One worker takes half the tokens per step of two, counted on from the checkpoint's total.
    two_per_step = before[resumed_at].tokens_seen - before[resumed_at - 1].tokens_seen  # type: ignore[operator]
    assert after[resumed_at + 1].tokens_seen == before[resumed_at].tokens_seen + two_per_step // 2  # type: ignore[operator]
    # The loss picks up where the two workers left it, far below the untrained start.
    first, last_before, first_after = before[1].loss, before[resumed_at].loss, after[resumed_at + 1].loss
    assert first is not None and last_before is not None and first_after is not None
    assert abs(first_after - last_before) < 0.15 * last_before, (last_before, first_after)
    assert first_after < first - 0.5, (first, first_after)
