"""The two examples, examples/tiny-cpu-hf.yaml (SFT with the Hugging Face Trainer) and
examples/tiny-cpu-custom.yaml (a custom function), loaded the way `llmtrain run` loads them and
shortened to 30 steps, on 2 CPU workers: each run has a worker killed after its first checkpoint
(maxWorkerFailures 1), resumes from it, trains to a lower loss, leaves checkpoints and a loadable
Hugging Face export, and reports progress the way the built-in loop does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.kube_progress import progress_fields
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.local import load_job_config
from llmtrain_trainer.main import run_training
from llmtrain_trainer.preflight import check
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.trainer import (
    REPO,
    losses,
    records,
    result,
    run_killing_a_worker,
    the_one_restart,
    tiny_config,
)

pytestmark = pytest.mark.slow

STEPS, EVERY = 30, 10
EXAMPLES = {"huggingface": "tiny-cpu-hf.yaml", "custom": "tiny-cpu-custom.yaml"}
# Text the trained model should find likely (the loss is taken after the prompt, if any).
PROBES = {
    "huggingface": ("Q: What is 3 plus 4?\nA: ", "3 + 4 = 7."),
    "custom": ("", "Tom had a red ball. Tom loved it very much."),
}


def example_config(mode: str, runs: Path) -> TrainerConfig:
    """The example as `llmtrain run` would train it, shortened and allowed one worker failure."""
    config = load_job_config(REPO / "examples" / EXAMPLES[mode], runs, use_gpu=False)
    document = config.model_dump(mode="json", by_alias=True)
    document["maxWorkerFailures"] = 1
    document["training"].update(maxSteps=STEPS, logEverySteps=1)
    document["checkpoint"].update(everySteps=EVERY, export=True)
    document["dataset"]["maxSeqLength"] = 64
    return TrainerConfig.model_validate(document)


@pytest.fixture(scope="module")
def killed_run(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], tuple[TrainerConfig, dict[str, int]]]:
    runs: dict[str, tuple[TrainerConfig, dict[str, int]]] = {}

    def get(mode: str) -> tuple[TrainerConfig, dict[str, int]]:
        if mode not in runs:
            config = example_config(mode, tmp_path_factory.mktemp(mode))
            assert config.trainer.type == mode and config.scaling.num_workers == 2
            runs[mode] = (config, run_killing_a_worker(config))
        return runs[mode]

    return get


@pytest.fixture(params=list(EXAMPLES))
def run(
    request: pytest.FixtureRequest, killed_run: Callable[[str], tuple[TrainerConfig, dict[str, int]]]
) -> tuple[TrainerConfig, dict[str, int]]:
    return killed_run(str(request.param))


def test_loss_falls_and_checkpoints_land_in_the_run_dir(run: tuple[TrainerConfig, dict[str, int]]) -> None:
    config, _ = run
    curve = losses(config)
    assert sorted(curve) == list(range(1, STEPS + 1))
    assert curve[1] > 5.5  # ln(384) ≈ 5.95 for a fresh byte-level model
    assert curve[STEPS] < 0.7 * curve[1], curve
    done = result(config)
    assert done["finished"] and done["steps"] == STEPS and done["trainer"] == config.trainer.type
    last = Path(done["checkpoint"])
    assert last.name == "checkpoint-step-00000030"
    if config.trainer.type == "huggingface":
        assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= {
            p.name for p in (last / "checkpoint").iterdir()
        }
    else:
        assert (last / "state.pt").exists()


def test_a_killed_worker_resumes_from_the_checkpoint(run: tuple[TrainerConfig, dict[str, int]]) -> None:
    config, killed = run
    restart = the_one_restart(config, killed, STEPS, EVERY)
    assert result(config)["resumed_from_step"] == restart


def test_progress_reaches_the_status(run: tuple[TrainerConfig, dict[str, int]]) -> None:
    """Folded as kube_progress folds them into status.progress: the step advances to the end."""
    config, _ = run
    state: dict[str, Any] = {}
    seen: list[int] = []
    for record in records(config):
        state = progress_fields(state, record)
        seen.append(state["step"])
    assert state["step"] == STEPS and state["summary"] == f"{STEPS}/{STEPS}"
    assert state["loss"] < 0.7 * losses(config)[1]
    assert len(set(seen)) > STEPS // 2
    # Throughput from the tokens each mode reports (HF: the Trainer's num_input_tokens_seen;
    # custom: the example's tokens_seen), on every step record but an attempt's first.
    steps = [r for r in records(config) if r.event == "step"]
    rates = [r.tokens_per_second for r in steps if r.tokens_per_second is not None]
    assert len(rates) >= STEPS - 4 and min(rates) > 0, rates
    assert state["tokensPerSecond"] > 0 and state["etaSeconds"] == 0


@pytest.mark.parametrize("mode", list(EXAMPLES))
def test_resume_from_run_continues_another_run(
    mode: str,
    killed_run: Callable[[str], tuple[TrainerConfig, dict[str, int]]],
    tmp_path: Path,
) -> None:
    """spec.resumeFrom.run in the Hugging Face and custom modes: a new job starts at the other
    run's latest checkpoint, with its state (the loss does not start over), and trains on."""
    earlier, _ = killed_run(mode)
    earlier_dir = Path(earlier.run_dir)
    document = earlier.model_dump(mode="json", by_alias=True)
    document.update(
        job={"name": "continued", "namespace": "test"},
        runName="uid-continued",
        storagePath=str(earlier_dir.parent.parent / "continued"),
        maxWorkerFailures=0,
        resumeFrom={
            "runsRoot": str(earlier_dir.parent.parent),
            "run": f"{earlier_dir.parent.name}/{earlier_dir.name}",
        },
    )
    document["training"]["maxSteps"] = STEPS + EVERY
    document["checkpoint"]["export"] = False
    continued = TrainerConfig.model_validate(document)
    check(continued)  # what the entrypoint checks first: the other run's checkpoint fits this job
    run_training(continued, LoopOptions(log_lines=False))
    events = records(continued)
    assert [r.step for r in events if r.event == "resumed"] == [STEPS]
    assert not any(r.event == "started" for r in events)
    curve = losses(continued)
    assert sorted(curve) == list(range(STEPS + 1, STEPS + EVERY + 1))
    assert curve[STEPS + 1] < 0.7 * losses(earlier)[1], "it went on from the trained weights"
    done = result(continued)
    assert done["resumed_from_step"] == STEPS and str(earlier_dir) in done["resume_from"]
    assert Path(done["checkpoint"]).parent == Path(continued.run_dir)


def test_custom_function_starts_from_a_seed_checkpoint(
    killed_run: Callable[[str], tuple[TrainerConfig, dict[str, int]]], tmp_path: Path
) -> None:
    """spec.resumeFrom.checkpoint in the custom mode: the function gets it as seed_checkpoint and
    (examples/custom/tiny_train.py) takes its weights, starting at step 0 with a fresh optimizer."""
    earlier, _ = killed_run("custom")
    seed = Path(result(earlier)["checkpoint"])
    document = earlier.model_dump(mode="json", by_alias=True)
    document.update(
        job={"name": "seeded", "namespace": "test"},
        runName="uid-seeded",
        storagePath=str(tmp_path / "seeded"),
        maxWorkerFailures=0,
        resumeFrom={"runsRoot": str(tmp_path), "checkpoint": str(seed)},
    )
    document["training"]["maxSteps"] = EVERY
    document["checkpoint"]["export"] = False
    seeded = TrainerConfig.model_validate(document)
    check(seeded)
    run_training(seeded, LoopOptions(log_lines=False))
    events = records(seeded)
    started = [r for r in events if r.event == "started"]
    assert len(started) == 1 and not any(r.event == "resumed" for r in events)
    assert started[0].message is not None and str(seed) in started[0].message
    curve = losses(seeded)
    assert sorted(curve) == list(range(1, EVERY + 1))
    assert curve[1] < 0.7 * losses(earlier)[1], "step 1 already has the seed's trained weights"
    assert result(seeded)["resumed_from_step"] is None


def test_hf_lora_export_merges_on_request(ray_address: str, tmp_path: Path) -> None:
    """method.lora.mergeOnExport in the Hugging Face mode: `export/` holds the adapters and
    `export/merged/` a plain model that computes what base + adapters compute."""
    from llmtrain.api.spec import ModelSpec
    from llmtrain_trainer.model import build_from_config, model_config
    from peft import PeftModel

    from tests.support.trainer import TINY_LLAMA

    config = tiny_config(
        tmp_path,
        "hf-lora",
        strategy={"type": "ddp"},
        trainer={"type": "huggingface"},
        method={"type": "lora", "lora": {"rank": 8, "alpha": 16, "mergeOnExport": True}},
        training={"maxSteps": EVERY},
        checkpoint={"everySteps": EVERY, "export": True},
    )
    run_training(config, LoopOptions(log_lines=False))
    export = Path(config.export_dir)
    assert (export / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(export / "merged")
    assert type(merged).__name__ == "LlamaForCausalLM"
    assert not any("lora" in name for name in merged.state_dict())

    def base() -> torch.nn.Module:  # the HF mode's inline model: seeded, so rebuilt identically
        spec = ModelSpec(config=TINY_LLAMA, tokenizer="byte-level")
        return build_from_config(model_config(spec), torch.float32, meta=False, seed=config.training.seed)

    adapted = PeftModel.from_pretrained(base(), export)
    ids = AutoTokenizer.from_pretrained(export / "merged")("Tom had a red ball.", return_tensors="pt")[
        "input_ids"
    ]
    with torch.no_grad():
        expected = adapted(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        untrained = base()(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, untrained, atol=1e-4), "the adapters were trained and merged"


def test_export_loads_and_is_trained(run: tuple[TrainerConfig, dict[str, int]]) -> None:
    config, _ = run
    export = Path(config.export_dir)
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    prompt, answer = PROBES[config.trainer.type]
    ids = tokenizer(prompt + answer, return_tensors="pt")["input_ids"]
    labels = ids.clone()
    labels[:, : len(tokenizer(prompt)["input_ids"])] = -100
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss
    # A fresh byte-level model is near ln(384) ≈ 5.95 nats per token.
    assert float(loss) < 4.5


def test_hf_trainer_with_deepspeed_merges_every_ranks_shards_and_resumes(
    ray_address: str, tmp_path: Path
) -> None:
    """ZeRO-2 under the Hugging Face Trainer: both ranks' optimizer shards land in one registered
    checkpoint (a merge, not an overwrite), a continued run resumes the Trainer from it, and the
    Trainer's evaluations become validation records."""
    overrides: dict[str, Any] = {
        "strategy": {"type": "deepspeed", "deepspeed": {"zeroStage": 2}},
        "trainer": {"type": "huggingface"},
        "checkpoint": {"everySteps": EVERY},
        "dataset": {"validationSplit": 0.1},  # evaluated every checkpoint.everySteps
    }
    first = tiny_config(tmp_path, "hf-zero2", training={"maxSteps": 20}, **overrides)
    run_training(first, LoopOptions(log_lines=False))
    shards = {
        p.name for p in (Path(first.run_dir) / "checkpoint-step-00000020/checkpoint/global_step20").iterdir()
    }
    assert {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= shards, shards

    continued = tiny_config(tmp_path, "hf-zero2", training={"maxSteps": 30}, **overrides)
    run_training(continued, LoopOptions(log_lines=False))
    events = records(continued)
    assert [r.step for r in events if r.event == "resumed"] == [20]
    curve = losses(continued)
    assert sorted(curve) == list(range(1, 31)) and curve[30] < 0.7 * curve[1]
    assert result(continued)["resumed_from_step"] == 20
    validation = {r.step: r.val_loss for r in events if r.event == "validation"}
    assert sorted(validation) == [10, 20, 30] and validation[30] < validation[10], validation
