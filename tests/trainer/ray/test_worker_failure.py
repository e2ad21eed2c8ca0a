"""A training worker killed mid-run: with maxWorkerFailures 1, Ray Train restarts the worker group
and the run completes from the latest checkpoint, repeating at most one checkpoint interval."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.trainer import records, result, run_killing_a_worker, the_one_restart, tiny_config

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
    killed = run_killing_a_worker(config)
    restart_step = the_one_restart(config, killed, STEPS, EVERY)
    events = records(config)
    resume_index = next(i for i, r in enumerate(events) if r.event == "resumed")
    before = [r.step for r in events[:resume_index] if r.event == "step"]
    # Work redone after the restart: the steps past the checkpoint that the killed attempt ran.
    assert max(before) - restart_step <= EVERY
    done = result(config)
    assert done["finished"] and done["resumed_from_step"] == restart_step
