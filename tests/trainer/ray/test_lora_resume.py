"""FSDP2 + LoRA on a pretrained base, with adapter dropout on: a worker killed after a checkpoint
and the run restarted by Ray Train must continue exactly like an uninterrupted run.

This reaches what a LoRA resume under FSDP2 depends on: checkpoints without the frozen base
(re-read from the pretrained folder on restart), the `strict=False` load of the adapters and their
optimizer state, and the RNG restore — with dropout on, every step draws masks, so a restarted run
whose RNG were not restored would train on other masks and drift from the reference at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training

from tests.support.trainer import (
    losses,
    records,
    result,
    run_killing_a_worker,
    save_tiny_pretrained,
    tiny_config,
)

pytestmark = pytest.mark.slow

STEPS, EVERY = 20, 5
LOSS_TOLERANCE = 1e-4  # as tests/trainer/ray/test_resume.py: same data, RNG and world size in fp32


def overrides(pretrained: Path) -> dict[str, Any]:
    return {
        "model": {"name": str(pretrained), "config": None, "tokenizer": None},
        "method": {
            "type": "lora",
            "lora": {"rank": 8, "alpha": 16, "dropout": 0.1, "targetModules": ["q_proj", "v_proj", "o_proj"]},
        },
        "training": {"maxSteps": STEPS, "learningRate": 0.02},
        "checkpoint": {"everySteps": EVERY},
    }


@pytest.mark.timeout(900)
def test_fsdp_lora_with_dropout_resumes_exactly(ray_address: str, storage: Path, tmp_path: Path) -> None:
    pretrained = save_tiny_pretrained(tmp_path / "base-model")
    reference = tiny_config(storage, "lora-reference", **overrides(pretrained))
    run_training(reference, LoopOptions(log_lines=False))

    interrupted = tiny_config(storage, "lora-interrupted", maxWorkerFailures=1, **overrides(pretrained))
    run_killing_a_worker(interrupted)

    restarted = [r for r in records(interrupted) if r.event == "resumed"]
    assert len(restarted) == 1 and EVERY <= restarted[0].step < STEPS
    assert result(interrupted)["resumed_from_step"] == restarted[0].step
    expected, actual = losses(reference), losses(interrupted)
    assert sorted(actual) == sorted(expected) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert actual[step] == pytest.approx(expected[step], abs=LOSS_TOLERANCE), step
    assert expected[STEPS] < expected[1] - 0.2, "the adapters did not learn"
