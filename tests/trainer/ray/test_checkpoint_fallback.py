"""A run whose latest checkpoint is corrupt resumes from the previous one instead of failing.

The first run trains to the end (checkpoints at steps 10 and 20); one shard of the step-20
checkpoint is then truncated, as a torn write or a damaged volume leaves it. Starting the run again,
Ray Train names step 20 as the latest checkpoint; the trainer must skip it (saying why), resume at
step 10 and train steps 11-20 exactly as the first run did.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training
from llmtrain_trainer.rundir import checkpoint_name

from tests.support.trainer import losses, records, result, run_dir, tiny_config

pytestmark = pytest.mark.slow

STEPS, EVERY = 20, 10
LOSS_TOLERANCE = 1e-4  # same data, RNG and world size in fp32: equal up to collective rounding


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(ray_address: str, storage: Path) -> None:
    config = tiny_config(storage, "fallback", training={"maxSteps": STEPS}, checkpoint={"everySteps": EVERY})
    run_training(config, LoopOptions(log_lines=False))
    first = losses(config)
    latest = run_dir(config) / checkpoint_name(STEPS)
    shard = sorted(latest.glob("*.distcp"))[0]
    with shard.open("r+b") as file:
        file.truncate(shard.stat().st_size // 2)

    run_training(config, LoopOptions(log_lines=False))

    done = result(config)
    assert done["finished"] and done["resumed_from_step"] == EVERY
    assert len(done["skipped_checkpoints"]) == 1 and latest.name in done["skipped_checkpoints"][0]
    resumed = [r for r in records(config) if r.event == "resumed"]
    assert len(resumed) == 1 and resumed[0].step == EVERY
    assert (
        resumed[0].message is not None
        and f"skipped unusable checkpoints: {latest.name}" in resumed[0].message
    )
    events = records(config)
    after = [r.step for r in events[events.index(resumed[0]) :] if r.event == "step"]
    assert after == list(range(EVERY + 1, STEPS + 1))
    second = losses(config)
    for step in range(EVERY + 1, STEPS + 1):
        assert second[step] == pytest.approx(first[step], abs=LOSS_TOLERANCE), step


def test_training_on_past_a_skipped_checkpoint_keeps_the_run_restartable(
    ray_address: str, storage: Path
) -> None:
    """After the fallback, step 10 is saved again and `keep + 1` more checkpoints follow, so Ray
    Train retires both the corrupt step-10 entry and the new one; a restarted driver (a RayJob
    retry) then resumes the newest. Re-saving into the reported directory made Ray delete the new
    files with the old entry and fail the controller on the missing path."""
    keep, every = 2, 5
    config = tiny_config(
        storage,
        "refallback",
        training={"maxSteps": 2 * every},
        checkpoint={"everySteps": every, "keep": keep},
    )
    run_training(config, LoopOptions(log_lines=False))
    corrupt = run_dir(config) / checkpoint_name(2 * every)
    shard = sorted(corrupt.glob("*.distcp"))[0]
    with shard.open("r+b") as file:
        file.truncate(shard.stat().st_size // 2)

    longer = (2 + keep + 1) * every
    config = config.model_copy(update={"training": config.training.model_copy(update={"max_steps": longer})})
    run_training(config, LoopOptions(log_lines=False))
    assert result(config)["resumed_from_step"] == every

    final = longer + every
    config = config.model_copy(update={"training": config.training.model_copy(update={"max_steps": final})})
    run_training(config, LoopOptions(log_lines=False))  # a new driver: Ray Train reads its snapshot

    done = result(config)
    assert done["finished"] and done["steps"] == final and done["resumed_from_step"] == longer
    kept = sorted(p.name for p in run_dir(config).glob("checkpoint-step-*"))
    assert kept == [checkpoint_name(longer), checkpoint_name(final)]
