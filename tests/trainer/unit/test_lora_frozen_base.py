"""A LoRA base is held in the compute dtype and does no training work: built through the real
strategies (FSDP2 and DDP, one gloo process), its frozen parameters are stored in bf16 (no fp32
master, nothing for FSDP2 to cast before an all-gather), never get a gradient or optimizer state and
never change, while the fp32 adapters train. A CPU computes in fp32, so the compute dtype is set to
bf16 here as a GPU's would be."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain import memory
from llmtrain_trainer import model as models
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.strategies import make_strategy
from llmtrain_trainer.strategies.base import Strategy
from torch.distributed.tensor import DTensor

from tests.support.trainer import TINY_LLAMA, save_tiny_pretrained, tiny_config

CPU = torch.device("cpu")
LORA = {
    "type": "lora",
    "lora": {"rank": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["q_proj", "v_proj"]},
}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, pretrained: bool) -> Strategy:
    monkeypatch.setattr("llmtrain_trainer.strategies.base.compute_dtype", lambda *_: torch.bfloat16)
    model: dict[str, Any] = {}
    if pretrained:
        folder = save_tiny_pretrained(tmp_path / "base-model")
        model = {"model": {"name": str(folder), "config": None, "tokenizer": None}}
    config = tiny_config(
        tmp_path,
        f"lora-{kind}",
        scaling={"numWorkers": 1},
        method=LORA,
        strategy={"type": kind},
        training={"precision": "bf16", "learningRate": 0.01, "warmupRatio": 0.0},
        **model,
    )
    env = WorkerEnv(rank=0, world_size=1, local_rank=0, device=CPU)
    strategy = make_strategy(config, env, total_steps=10)
    assert strategy.dtype == torch.bfloat16
    return strategy


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, int(TINY_LLAMA["vocab_size"]), (4, 32), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


@pytest.mark.usefixtures("one_process_group")
@pytest.mark.parametrize(("kind", "pretrained"), [("fsdp", True), ("fsdp", False), ("ddp", False)])
def test_the_frozen_base_is_bf16_without_gradients_or_optimizer_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, pretrained: bool
) -> None:
    strategy = _strategy(tmp_path, monkeypatch, kind, pretrained)
    named = dict(strategy.model.named_parameters())
    adapters = {name: p for name, p in named.items() if "lora_" in name}
    base = {name: p for name, p in named.items() if "lora_" not in name}
    assert adapters and base
    assert all(not p.requires_grad and _local(p).dtype == torch.bfloat16 for p in base.values())
    assert all(p.requires_grad and _local(p).dtype == torch.float32 for p in adapters.values())
    if pretrained:  # read from the checkpoint's fp32 tensors into the bf16 shards
        from safetensors.torch import load_file

        saved = load_file(str(tmp_path / "base-model" / "model.safetensors"))
        q = next(name for name in base if name.endswith("layers.0.self_attn.q_proj.base_layer.weight"))
        expected = saved["model.layers.0.self_attn.q_proj.weight"].bfloat16()
        assert torch.equal(_local(base[q]).detach(), expected)
    else:
        assert all(_local(p).abs().sum() > 0 for name, p in base.items() if name.endswith("weight"))
    # The estimate's parameter bytes (as on a GPU in bf16) are what the strategy holds.
    plan = dataclasses.replace(memory.Plan.of_trainer(strategy.config), on_gpu=True)
    estimate = memory.estimate(plan, models.model_config(strategy.config.model).to_dict())
    assert estimate is not None
    held = sum(_local(p).numel() * _local(p).element_size() for p in named.values())
    assert held == estimate.params

    frozen_before = {name: _local(p).detach().clone() for name, p in base.items()}
    first = last = None
    strategy.train()
    for _ in range(6):
        loss = strategy.forward_backward(_batch(), loss_scale=1.0 / (4 * 31), last_micro_batch=True)
        assert all(p.grad is None for p in base.values())
        assert all(p.grad is not None for p in adapters.values())
        strategy.step()
        first = float(loss) if first is None else first
        last = float(loss)
    assert first is not None and last is not None and last < first
    optimizer: torch.optim.Optimizer = strategy.optimizer  # type: ignore[attr-defined]
    stateful = {id(p) for p in optimizer.state}
    assert stateful == {id(p) for p in adapters.values()}
    assert all(torch.equal(_local(base[name]).detach(), value) for name, value in frozen_before.items())
    if kind == "fsdp":
        # FSDP2 (set up at the first forward) gathers the frozen shards as they are: no
        # per-step cast to the compute dtype (param_dtype None), only the adapters cast.
        from torch.distributed.fsdp import FSDPModule

        for module in strategy.model.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                for fsdp_param in group.fsdp_params if group else []:
                    frozen = not fsdp_param.sharded_param.requires_grad
                    assert (fsdp_param.param_dtype is None) == frozen, fsdp_param._param_fqn


@pytest.mark.usefixtures("one_process_group")
def test_a_bf16_base_lora_checkpoint_and_export_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint holds the fp32 adapters only and restores them next to a fresh bf16 base; the
    export gathers the base in bf16 and the adapters in fp32 under their trained values."""
    trained = _strategy(tmp_path, monkeypatch, "fsdp", pretrained=True)
    for _ in range(2):
        trained.forward_backward(_batch(), loss_scale=1.0 / (4 * 31), last_micro_batch=True)
        trained.step()
    adapters = {n: _local(p).detach().clone() for n, p in trained.model.named_parameters() if "lora_" in n}
    trained.save(tmp_path / "checkpoint")

    resumed = _strategy(tmp_path, monkeypatch, "fsdp", pretrained=True)
    resumed.load(tmp_path / "checkpoint")
    named = dict(resumed.model.named_parameters())
    assert all(torch.equal(_local(named[n]).detach(), value) for n, value in adapters.items())
    assert all(_local(p).dtype == torch.bfloat16 for n, p in named.items() if "lora_" not in n)

    exported = {t.name: t for t in resumed.export_tensors()}
    for name, value in adapters.items():
        gathered = exported[name].gather()
        assert exported[name].trainable and gathered is not None and torch.equal(gathered, value)
    q = next(n for n in exported if n.endswith("layers.0.self_attn.q_proj.base_layer.weight"))
    assert exported[q].dtype == torch.bfloat16 and not exported[q].trainable
