"""ZeRO-3 + a pretrained model (a local path) + LoRA on 2 workers: the 70B example's path.

Loading a pretrained model under ZeRO-3 is collective (zero.Init broadcasts every parameter), so
it deadlocked while rank 0 loaded alone and the others waited in a barrier. A short collective
timeout turns such a deadlock into a failure within a minute instead of a hang.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training

from tests.support.trainer import losses, records, result, save_tiny_pretrained, tiny_config

pytestmark = pytest.mark.slow

FIRST_STEPS, MORE_STEPS, EVERY = 8, 12, 4


def overrides(pretrained: Path, max_steps: int) -> dict[str, Any]:
    return {
        "model": {"name": str(pretrained), "config": None, "tokenizer": None},
        "method": {
            "type": "lora",
            "lora": {"rank": 8, "alpha": 16, "dropout": 0.0, "targetModules": ["q_proj", "v_proj", "o_proj"]},
        },
        "strategy": {"type": "deepspeed", "deepspeed": {"zeroStage": 3}},
        "collectiveTimeoutSeconds": 60,
        "training": {"maxSteps": max_steps, "learningRate": 0.02},
        "checkpoint": {"everySteps": EVERY},
    }


@pytest.mark.timeout(900)
def test_zero3_lora_from_pretrained_trains_and_resumes(
    ray_address: str, storage: Path, tmp_path: Path
) -> None:
    pretrained = save_tiny_pretrained(tmp_path / "base-model")
    first = tiny_config(storage, "zero3-lora", **overrides(pretrained, FIRST_STEPS))
    run_training(first, LoopOptions(log_lines=False))
    curve = losses(first)
    assert sorted(curve) == list(range(1, FIRST_STEPS + 1))
    assert curve[FIRST_STEPS] < curve[1] - 0.2, curve

    # The same run with more steps resumes from its last checkpoint (adapters, optimizer, data).
    more = tiny_config(storage, "zero3-lora", **overrides(pretrained, MORE_STEPS))
    run_training(more, LoopOptions(log_lines=False))
    done = result(more)
    assert done["finished"] and done["resumed_from_step"] == FIRST_STEPS
    events = records(more)
    resumed_at = max(i for i, r in enumerate(events) if r.event == "resumed")
    assert [r.step for r in events[resumed_at:] if r.event == "step"] == list(
        range(FIRST_STEPS + 1, MORE_STEPS + 1)
    )
    # Trained adapters were restored on the pretrained base: no fall back to the starting loss.
    curve = losses(more)
    assert curve[FIRST_STEPS + 1] < curve[1] - 0.2, curve
