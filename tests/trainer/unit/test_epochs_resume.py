"""The built-in loop resumed on another worker count keeps an epochs-based LR schedule where its
samples seen put it: one process (a gloo group, no Ray) resumes a checkpoint stamped as two
workers' and must continue the one-worker schedule at twice the step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.lifecycle import Lifecycle, LoopOptions
from llmtrain_trainer.modes import builtin, mode_for
from llmtrain_trainer.optim import lr_factor
from llmtrain_trainer.run_context import RayRunContext
from llmtrain_trainer.rundir import STATE_FILE, checkpoint_name

from tests.support.trainer import TINY_STORIES, losses, records, result, tiny_config

ENV = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
EVERY = 4
MICRO_BATCH = 4
PEAK = 0.003


def _attempt(config: Any, monkeypatch: pytest.MonkeyPatch, latest: Path | None) -> None:
    import ray.train

    class Reported:
        path = str(latest)

    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None if latest is None else Reported())
    run_dir = Path(config.run_dir)
    with Lifecycle(config, ENV, run_dir, LoopOptions(log_lines=False), mode_for("builtin")) as life:
        builtin.TrainingRun(config, ENV, run_dir, life).run()


@pytest.mark.slow  # trains three runs
@pytest.mark.usefixtures("one_process_group")
def test_the_loop_resumed_on_another_worker_count_continues_the_epochs_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RayRunContext, "report_checkpoint", lambda self, directory, metrics, env: None)
    data = tmp_path / "stories.txt"
    data.write_bytes(TINY_STORIES.read_bytes()[:6000])  # about 90 sequences of 64 bytes: ~22 steps
    config = tiny_config(
        tmp_path,
        "epochs",
        scaling={"numWorkers": 1},
        strategy={"type": "ddp"},
        dataset={"path": str(data)},
        training={
            "maxSteps": None,
            "epochs": 1,
            "microBatchSize": MICRO_BATCH,
            "warmupRatio": 0,
            "learningRate": PEAK,
        },
        checkpoint={"everySteps": EVERY},
    )
    _attempt(config, monkeypatch, None)
    total = max(losses(config))
    assert total > 2 * EVERY + 1

    # As if two workers had taken the first EVERY steps: twice the sequences a step.
    saved = Path(config.run_dir) / checkpoint_name(EVERY)
    state: dict[str, Any] = json.loads((saved / STATE_FILE).read_text())
    seen = EVERY * MICRO_BATCH * 2
    state.update(world_size=2, samples_seen=seen, data={"epoch": 0, "offset": seen})
    (saved / STATE_FILE).write_text(json.dumps(state))
    _attempt(config, monkeypatch, saved)

    done = result(config)
    assert done["resumed_from_step"] == EVERY
    assert done["steps"] == total - EVERY, "the one-worker run's steps left after 2×EVERY of them"
    resumed = [r for r in records(config) if r.event == "step" and r.step == EVERY + 1][-1]
    expected = PEAK * lr_factor(2 * EVERY + 1, warmup=0, total=total, kind="cosine")
    assert resumed.learning_rate == pytest.approx(expected)
