"""The memory estimate against real models on the meta device and a real optimizer step on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain import memory
from llmtrain.api.spec import MethodSpec
from llmtrain_trainer import model as models
from llmtrain_trainer.preflight import PreflightError, check
from transformers import AutoConfig

from tests.support.trainer import TINY_LLAMA, tiny_config

SMALL = {
    "vocab_size": 1000,
    "hidden_size": 96,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
}


def meta_model(config: dict[str, Any]) -> torch.nn.Module:
    hf_config = AutoConfig.for_model(**config)
    return models.build_from_config(hf_config, torch.float32, meta=True, seed=0)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama", **SMALL},
        {"model_type": "llama", **SMALL, "tie_word_embeddings": True},
        {"model_type": "llama", **SMALL, "attention_bias": True, "mlp_bias": True},
        {"model_type": "llama", **SMALL, "head_dim": 32},
        {"model_type": "qwen2", **SMALL},
        {"model_type": "mistral", **SMALL},
        TINY_LLAMA,
    ],
    ids=["llama", "llama-tied", "llama-biases", "llama-head-dim", "qwen2", "mistral", "tiny-example"],
)
def test_the_count_from_the_config_is_the_models(config: dict[str, Any]) -> None:
    shape = memory.Shape.from_config(AutoConfig.for_model(**config).to_dict())
    assert shape is not None
    assert shape.parameters() == models.count_parameters(meta_model(config))[0]


def test_the_lora_count_is_peft_s() -> None:
    config = {"model_type": "llama", **SMALL}
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    method = MethodSpec.model_validate({"type": "lora", "lora": {"rank": 8, "targetModules": targets}})
    wrapped = models.apply_lora(meta_model(config), method)
    shape = memory.Shape.from_config(AutoConfig.for_model(**config).to_dict())
    assert shape is not None
    assert shape.lora_parameters(8, targets) == models.count_parameters(wrapped)[1]


def test_the_states_estimate_is_what_one_optimizer_step_holds(tmp_path: Path) -> None:
    """One process, fp32, AdamW: parameters, gradients and both moments, byte for byte."""
    config = tiny_config(tmp_path, "mem", scaling={"numWorkers": 1}, strategy={"type": "ddp"})
    model = models.build_from_config(models.model_config(config.model), torch.float32, meta=False, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()

    def nbytes(tensors: Any) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    params = list(model.parameters())
    held = {
        "params": nbytes(params),
        "grads": nbytes(p.grad for p in params if p.grad is not None),
        "optimizer": nbytes(v for state in optimizer.state.values() for v in state.values() if v.dim() > 0),
    }
    estimate = memory.estimate(memory.Plan.of_trainer(config))
    assert estimate is not None
    assert held == {"params": estimate.params, "grads": estimate.grads, "optimizer": estimate.optimizer}


@pytest.mark.usefixtures("one_process_group")
def test_ddp_holds_a_second_fp32_copy_of_the_gradients_in_its_buckets(tmp_path: Path) -> None:
    """The reducer's buckets, as the DDP strategy wraps the model (gradient_as_bucket_view off):
    the estimate's `grad_buffers`, byte for byte."""
    from torch.nn.parallel import DistributedDataParallel

    config = tiny_config(tmp_path, "mem", scaling={"numWorkers": 1}, strategy={"type": "ddp"})
    model = models.build_from_config(models.model_config(config.model), torch.float32, meta=False, seed=0)
    ddp = DistributedDataParallel(model)
    ids = torch.randint(0, 256, (2, 16))
    ddp(input_ids=ids, labels=ids).loss.backward()
    buckets = ddp.reducer._get_zeros_like_grad_buckets()
    held = sum(b.buffer().numel() * b.buffer().element_size() for b in buckets)
    estimate = memory.estimate(memory.Plan.of_trainer(config))
    assert estimate is not None and held == estimate.grad_buffers == estimate.grads


def test_preflight_refuses_a_plan_whose_states_cannot_fit(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "mem", scaling={"deviceMemoryBytes": 100_000})
    with pytest.raises(
        PreflightError, match=r"^spec: cannot fit: parameters, gradients and optimizer"
    ) as info:
        check(config)
    assert "parameters from the model built on the meta device" in str(info.value)


def test_preflight_passes_a_plan_that_fits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_config(tmp_path, "mem", scaling={"deviceMemoryBytes": 2**30 * 4})
    with caplog.at_level("INFO", logger="llmtrain_trainer.preflight"):
        check(config)
    assert any("memory estimate per device" in r.getMessage() for r in caplog.records)
