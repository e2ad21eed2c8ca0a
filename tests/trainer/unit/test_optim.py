"""AdamW's parameter groups (weight decay on matmul weights only, whatever wraps the parameters)
and the learning-rate schedule."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from llmtrain.api.spec import MethodSpec, ModelSpec, TrainingSpec
from llmtrain_trainer.checkpoint import TrainerState
from llmtrain_trainer.model import apply_lora, build_from_config, model_config
from llmtrain_trainer.modes.builtin import resumed_schedule, total_steps
from llmtrain_trainer.optim import build_optimizer, build_scheduler, lr_factor, rebase_scheduler
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from tests.support.trainer import TINY_LLAMA, tiny_config

TRAINING = TrainingSpec(weight_decay=0.1)


def tiny_model(method: str = "full") -> nn.Module:
    config = model_config(ModelSpec(config=TINY_LLAMA, tokenizer="byte-level"))
    model = build_from_config(config, torch.float32, meta=False, seed=0)
    return apply_lora(model, MethodSpec.model_validate({"type": method}))


def decayed_names(model: nn.Module) -> dict[str, float]:
    """Each trainable parameter's name and the weight decay its optimizer group applies."""
    optimizer = build_optimizer(model, TRAINING, on_gpu=False)
    decay = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    assert len(decay) == sum(1 for p in optimizer.param_groups for _ in p["params"])  # each once
    return {name: decay[id(p)] for name, p in model.named_parameters() if p.requires_grad}


def test_norms_biases_and_embeddings_are_not_decayed() -> None:
    model = tiny_model()
    model.model.layers[0].self_attn.q_proj.bias = nn.Parameter(torch.zeros(64))  # a bias, 1-D
    decay = decayed_names(model)
    assert decay.pop("model.embed_tokens.weight") == 0.0  # also the tied head
    assert decay.pop("model.layers.0.self_attn.q_proj.bias") == 0.0
    norms = [name for name in decay if "norm" in name]
    assert len(norms) == 2 * 2 + 1 and all(decay.pop(name) == 0.0 for name in norms)
    assert len(decay) == 7 * 2 and set(decay.values()) == {0.1}  # every projection of both blocks


def test_lora_decays_its_adapters_and_leaves_the_frozen_base_out() -> None:
    decay = decayed_names(tiny_model("lora"))
    assert decay and all("lora_" in name for name in decay)
    assert set(decay.values()) == {0.1}


def test_a_zero3_partition_is_grouped_by_its_full_shape() -> None:
    """ZeRO-3 leaves an empty 1-D tensor in each parameter and keeps the real shape aside."""
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    for module in model:
        for name, param in list(module.named_parameters()):
            partition = nn.Parameter(torch.empty(0))
            partition.ds_shape = param.shape  # type: ignore[attr-defined]
            setattr(module, name, partition)
    optimizer = build_optimizer(model, TRAINING, on_gpu=False)
    assert [len(group["params"]) for group in optimizer.param_groups] == [1, 3]
    assert optimizer.param_groups[0]["params"][0] is model[0].weight


@pytest.mark.usefixtures("one_process_group")
def test_fsdp2_dtensor_parameters_are_grouped_by_their_global_shape() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = tiny_model()
    mesh = init_device_mesh("cpu", (1,))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert isinstance(model.model.norm.weight, DTensor)
    decay = decayed_names(model)
    assert [name for name, value in decay.items() if value == 0.0] == [
        "model.embed_tokens.weight",
        *(
            f"model.layers.{i}.{norm}.weight"
            for i in range(2)
            for norm in ("input_layernorm", "post_attention_layernorm")
        ),
        "model.norm.weight",
    ]


def test_warmup_then_cosine_linear_constant() -> None:
    cosine = [lr_factor(s, warmup=10, total=110, kind="cosine") for s in range(110)]
    assert cosine[0] == pytest.approx(0.1) and cosine[9] == pytest.approx(1.0)
    assert cosine[60] == pytest.approx(0.5, abs=1e-9) and cosine[109] == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.99))
    )
    assert all(a >= b for a, b in itertools.pairwise(cosine[10:]))
    assert lr_factor(60, warmup=10, total=110, kind="linear") == pytest.approx(0.5)
    assert lr_factor(100, warmup=10, total=110, kind="constant") == 1.0


def _schedule(training: TrainingSpec, total: int) -> tuple[torch.optim.Optimizer, LambdaLR]:
    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=1.0)
    return optimizer, build_scheduler(optimizer, training, total)


def test_an_epochs_schedule_resumed_on_another_worker_count_continues_where_it_was(tmp_path: Path) -> None:
    """Two workers take 12 steps for 2 epochs of 96 sequences, one worker 24. Halfway (step 6 on
    two workers), a resume on one worker continues the schedule at its 12th step, not its 6th,
    and ends with the data, where the schedule ends."""
    training = {"maxSteps": None, "epochs": 2, "microBatchSize": 8, "warmupRatio": 0.25}
    config = tiny_config(tmp_path, "epochs", training=training)
    sequences = 96
    optimizer, scheduler = _schedule(config.training, total_steps(config, sequences, 2))
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    next_lr = optimizer.param_groups[0]["lr"]
    state = TrainerState(step=6, samples_seen=6 * 16, world_size=2)

    end, shift = resumed_schedule(config, sequences, 1, state)
    assert (end, shift) == (18, 6.0)
    one_total = total_steps(config, sequences, 1)
    resumed, resumed_scheduler = _schedule(config.training, one_total)
    resumed.load_state_dict(optimizer.state_dict())
    resumed_scheduler.load_state_dict(scheduler.state_dict())
    rebase_scheduler(resumed_scheduler, config.training, one_total, shift)
    assert resumed.param_groups[0]["lr"] == pytest.approx(next_lr) == pytest.approx(0.75)
    rates = []
    for _ in range(state.step, end):
        rates.append(resumed.param_groups[0]["lr"])
        resumed.step()
        resumed_scheduler.step()
    assert rates == sorted(rates, reverse=True) and rates[-1] == pytest.approx(
        lr_factor(23, warmup=6, total=24, kind="cosine")
    )
    assert resumed.param_groups[0]["lr"] == pytest.approx(0.0)

    # A checkpoint written before samples were counted: its steps were taken on its own count.
    assert resumed_schedule(config, sequences, 1, TrainerState(step=6, world_size=2)) == (18, 6.0)
    # The same worker count, or a maxSteps run: steps and schedule stand.
    assert resumed_schedule(config, sequences, 2, state) == (12, 0.0)
    fixed = tiny_config(tmp_path, "steps", training={"maxSteps": 30})
    assert resumed_schedule(fixed, sequences, 1, state) == (30, 0.0)


def test_a_rebased_schedule_sets_the_next_learning_rate_at_once() -> None:
    """The learning rate a restored optimizer holds belongs to the old schedule: rebasing puts every
    group's rate (and the scheduler's last rate) on the new one before the next step, and keeps
    the schedule's kind."""
    training = TrainingSpec(warmup_ratio=0.1, lr_scheduler="linear")
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD([{"params": [model.weight], "lr": 1.0}, {"params": [model.bias], "lr": 0.5}])
    scheduler = build_scheduler(optimizer, training, 10)
    rebase_scheduler(scheduler, training, 20, shift=12)
    factor = lr_factor(12, warmup=2, total=20, kind="linear")
    assert factor == pytest.approx(1 - 10 / 18)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([factor, factor / 2])
    assert scheduler.get_last_lr() == pytest.approx([factor, factor / 2])
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(lr_factor(13, warmup=2, total=20, kind="linear"))


def test_the_schedule_holds_its_ends_and_follows_its_kind() -> None:
    """The peak is reached at the warm-up's last step and held from the next; a run whose warm-up
    covers all its steps stays at the peak; past the end (a resumed run's shifted schedule) the
    rate stays at the end's; the scheduler follows training.lrScheduler, not the cosine default."""
    assert lr_factor(10, warmup=10, total=110, kind="cosine") == pytest.approx(1.0)
    assert lr_factor(12, warmup=10, total=10, kind="linear") == 1.0
    assert lr_factor(130, warmup=10, total=110, kind="linear") == pytest.approx(0.0)
    assert lr_factor(11, warmup=10, total=11, kind="linear") == pytest.approx(0.0)
    optimizer, scheduler = _schedule(TrainingSpec(warmup_ratio=0.1, lr_scheduler="linear"), 10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(lr_factor(5, warmup=1, total=10, kind="linear"))


def test_adamw_settings_and_the_fused_kernel_on_gpus() -> None:
    """betas (0.9, 0.95) and eps 1e-8, the usual settings for LLM training, reach AdamW; the
    fused kernel is asked for on GPUs only."""
    training = TrainingSpec(weight_decay=0.1)
    on_cpu = build_optimizer(nn.Linear(4, 4), training, on_gpu=False)
    assert on_cpu.defaults["lr"] == training.learning_rate
    assert (on_cpu.defaults["betas"], on_cpu.defaults["eps"]) == ((0.9, 0.95), 1e-8)
    assert not on_cpu.defaults["fused"]
    assert build_optimizer(nn.Linear(4, 4), training, on_gpu=True).defaults["fused"] is True
