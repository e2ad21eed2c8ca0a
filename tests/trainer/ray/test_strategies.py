"""Each strategy trains the tiny model on 2 CPU workers, the loss falls, and the export works."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.trainer import losses, records, result, tiny_config

pytestmark = pytest.mark.slow

# Each case also switches on one more feature, so the suite covers them without extra runs.
CASES: dict[str, dict[str, Any]] = {
    "fsdp": {"strategy": {"type": "fsdp"}},
    # Offloading moves nothing on CPU workers, but runs the GPU path: parameters materialised on
    # the CPU, buffers on the worker's device, CPUOffloadPolicy in every FSDP group.
    "fsdp-offload": {"strategy": {"type": "fsdp", "fsdp": {"cpuOffload": True}}},
    "zero2": {
        "strategy": {"type": "deepspeed", "deepspeed": {"zeroStage": 2}},
        "training": {"microBatchSize": 4, "gradientAccumulationSteps": 2},
    },
    "zero3": {
        "strategy": {"type": "deepspeed", "deepspeed": {"zeroStage": 3}},
        "training": {"gradientCheckpointing": True},
    },
    "ddp": {"strategy": {"type": "ddp"}, "dataset": {"validationSplit": 0.1}},
    # HSDP: 2 replicas of 2 shards on 4 workers, micro-batch 4: the same 16 sequences per step.
    # A step timeout under the collective one: the mesh's groups are lowered after a barrier.
    "hsdp": {
        "strategy": {"type": "fsdp", "fsdp": {"hybridShardSize": 2}},
        "network": {"stepTimeoutSeconds": 240},
        "scaling": {"numWorkers": 4, "cpusPerWorker": 0.5},
        "training": {"microBatchSize": 4},
    },
}


@pytest.fixture(scope="module")
def train_case(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TrainerConfig]:
    """Trains a case on first use and remembers it, so tests can share runs."""
    runs: dict[str, TrainerConfig] = {}

    def get(name: str) -> TrainerConfig:
        if name not in runs:
            config = tiny_config(
                tmp_path_factory.mktemp(name), name, checkpoint={"export": True}, **CASES[name]
            )
            run_training(config, LoopOptions(log_lines=False))
            runs[name] = config
        return runs[name]

    return get


@pytest.fixture(params=list(CASES))
def trained(request: pytest.FixtureRequest, train_case: Callable[[str], TrainerConfig]) -> TrainerConfig:
    return train_case(str(request.param))


def test_loss_falls(trained: TrainerConfig) -> None:
    curve = losses(trained)
    assert sorted(curve) == list(range(1, 31)), "every step is logged once"
    # A byte-level model starts near ln(384) ≈ 5.95 nats; 30 steps on the tiny stories reach ≈3.
    assert curve[1] > 5.5
    assert curve[30] < 0.7 * curve[1], curve
    done = result(trained)
    assert done["finished"] and done["steps"] == 30
    assert Path(done["checkpoint"]).name == "checkpoint-step-00000030"
    if trained.dataset.validation_split:
        validation = {r.step: r.val_loss for r in records(trained) if r.event == "validation"}
        assert sorted(validation) == [10, 20, 30]
        assert validation[30] < validation[10]


def test_checkpoint_time_is_reported_and_in_the_eta(train_case: Callable[[str], TrainerConfig]) -> None:
    """After the step-10 checkpoint, each ETA holds the checkpoints left at its measured cost."""
    history = records(train_case("fsdp"))
    saves = {r.step: r.checkpoint_seconds for r in history if r.event == "checkpoint"}
    assert sorted(saves) == [10, 20, 30] and all(s is not None and s > 0 for s in saves.values())
    step_11 = next(r for r in history if r.event == "step" and r.step == 11)
    assert step_11.eta_seconds is not None and saves[10] is not None
    assert step_11.eta_seconds >= 2 * saves[10]  # the checkpoints at 20 and 30 are still ahead


def test_export_loads_and_generates(trained: TrainerConfig) -> None:
    export = Path(trained.export_dir)
    assert (export / "model.safetensors").exists() and (export / "tokenizer.json").exists()
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    prompt = tokenizer("Once upon a time", return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
        # The export is the trained model, not a fresh one: its loss is far below ln(vocab).
        batch = tokenizer("Tom had a red ball. Tom loved it very much.", return_tensors="pt")
        loss = model(**batch, labels=batch["input_ids"]).loss
    assert output.shape[1] == prompt["input_ids"].shape[1] + 12
    assert float(loss) < 4.5


@pytest.mark.parametrize("other", ["zero2", "hsdp"])
def test_strategies_and_accumulation_agree(train_case: Callable[[str], TrainerConfig], other: str) -> None:
    """FSDP2 with micro-batch 8, ZeRO-2 with 4 × 2 accumulated and HSDP on 4 workers with
    micro-batch 4 see the same 16 sequences per step (the global order is cut the same way), so
    their steps (loss and the clipped gradient norm) must agree up to float rounding."""
    fsdp, compared = train_case("fsdp"), train_case(other)
    first = {r.step: r for r in records(fsdp) if r.event == "step"}
    second = {r.step: r for r in records(compared) if r.event == "step"}
    for step in range(1, 6):
        assert second[step].loss == pytest.approx(first[step].loss, rel=1e-5), step
        assert second[step].grad_norm == pytest.approx(first[step].grad_norm, rel=1e-4), step
