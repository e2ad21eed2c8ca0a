"""A training worker killed mid-run: with maxWorkerFailures 1, Ray Train restarts the worker group
and the run completes from the latest checkpoint, repeating at most one checkpoint interval."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from llmtrain_trainer.loop import LoopOptions
from llmtrain_trainer.main import run_training

from tests.trainer.helpers import kill_a_worker_after_checkpoint, records, result, tiny_config

pytestmark = pytest.mark.slow

STEPS, EVERY = 40, 10


def test_killed_worker_resumes_from_last_checkpoint(ray_address: str, storage: Path) -> None:
    config = tiny_config(
        storage,
        "worker-killed",
        maxWorkerFailures=1,
        training={"maxSteps": STEPS},
        checkpoint={"everySteps": EVERY},
    )
    killed: dict[str, int] = {}
    killer = threading.Thread(target=kill_a_worker_after_checkpoint, args=(config, killed, 300), daemon=True)
    killer.start()
    run_training(config, LoopOptions(log_lines=False))
    killer.join()
    assert killed, "no worker was killed"

    events = records(config)
    resumed = [r for r in events if r.event == "resumed"]
    assert len(resumed) == 1, "exactly one restart"
    restart_step = resumed[0].step
    assert killed["checkpoint"] <= restart_step < STEPS and restart_step % EVERY == 0
    resume_index = events.index(resumed[0])
    before = [r.step for r in events[:resume_index] if r.event == "step"]
    after = [r.step for r in events[resume_index:] if r.event == "step"]
    # Work redone after the restart: the steps past the checkpoint that the killed attempt ran.
    assert max(before) - restart_step <= EVERY
    assert after == list(range(restart_step + 1, STEPS + 1))
    done = result(config)
    assert done["finished"] and done["resumed_from_step"] == restart_step
