"""training.earlyStopping and checkpoint.exportBest in a real run (2 CPU workers, gloo, DDP):
a learning rate far too high makes the validation loss rise after the first evaluations; the run
stops early, successfully, on every rank at the same step, keeps the best checkpoint through
rotation (keep: 1) and exports its weights, which equal a plain run trained to the best step."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training
from llmtrain_trainer.rundir import checkpoint_name
from safetensors.torch import load_file

from tests.support.trainer import records, result, run_dir, tiny_config

pytestmark = pytest.mark.slow

MAX_STEPS, EVERY = 24, 2
DIVERGING = {"learningRate": 0.3, "lrScheduler": "constant", "warmupRatio": 0.0, "logEverySteps": 2}


def config(storage: Path, name: str, max_steps: int, **extra: Any) -> TrainerConfig:
    """The diverging run; `extra` adds training (earlyStopping) and checkpoint (exportBest) fields."""
    return tiny_config(
        storage,
        name,
        strategy={"type": "ddp"},
        dataset={"validationSplit": 0.2},
        training={**DIVERGING, "maxSteps": max_steps, **extra.get("training", {})},
        checkpoint={"everySteps": EVERY, "keep": 1, "export": True, **extra.get("checkpoint", {})},
    )


def exported(config: TrainerConfig) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir(config) / "export" / "model.safetensors"))


def test_the_run_stops_early_and_exports_its_best_checkpoint(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    storage = tmp_path_factory.mktemp("early")
    stopped = config(
        storage,
        "stopped",
        MAX_STEPS,
        training={"earlyStopping": {"patience": 2}},
        checkpoint={"exportBest": True},
    )
    run_training(stopped, LoopOptions(log_lines=False))
    done = result(stopped)
    validations = {r.step: r.val_loss for r in records(stopped) if r.event == "validation"}
    best_step = min(validations, key=lambda step: validations[step] or math.inf)
    last_eval = max(validations)

    assert done["stopped_early"] and "early stopping" in done["stopped_early"], done
    assert done["steps"] == last_eval < MAX_STEPS
    # Exactly patience (2) evaluations after the best, none after.
    assert sorted(s for s in validations if s > best_step) == [best_step + EVERY, best_step + 2 * EVERY]
    assert done["best_checkpoint"] == str(run_dir(stopped) / checkpoint_name(best_step))
    assert done["best_val_loss"] == pytest.approx(validations[best_step])
    # keep: 1 rotates by validation loss: the best survives next to the latest (to resume from).
    kept = sorted(p.name for p in run_dir(stopped).glob("checkpoint-step-*"))
    assert kept == [checkpoint_name(best_step), checkpoint_name(last_eval)]
    finished = [r for r in records(stopped) if r.event == "finished"]
    assert finished and finished[-1].message == done["stopped_early"]

    # The same training, plainly to the best step: its final weights are the best checkpoint's.
    plain = config(storage, "plain", best_step)
    run_training(plain, LoopOptions(log_lines=False))
    best, reference = exported(stopped), exported(plain)
    assert best.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(best[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_the_hf_trainer_stops_early_and_exports_its_best_checkpoint(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same through transformers' EarlyStoppingCallback and load_best_model_at_end: the export
    is the best checkpoint's model file, which has moved into the run directory."""
    hf = tiny_config(
        tmp_path_factory.mktemp("hf"),
        "hf",
        strategy={"type": "ddp"},
        trainer={"type": "huggingface"},
        dataset={"validationSplit": 0.2},
        training={**DIVERGING, "maxSteps": MAX_STEPS, "earlyStopping": {"patience": 2}},
        checkpoint={"everySteps": EVERY, "keep": 10, "export": True, "exportBest": True},
    )
    run_training(hf, LoopOptions(log_lines=False))
    done = result(hf)
    assert done["stopped_early"] and done["steps"] < MAX_STEPS, done
    best = Path(done["best_checkpoint"])
    assert best.is_relative_to(run_dir(hf)), best
    reference = load_file(str(best / "model.safetensors"))
    export = exported(hf)
    assert export.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(export[name], tensor, rtol=0, atol=0, msg=name)
