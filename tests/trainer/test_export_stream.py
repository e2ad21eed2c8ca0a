"""The streamed export, in one process: what it writes loads with transformers and peft and holds
the same weights, sharded or not; a LoRA export without merge holds the adapters only."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from llmtrain.api.spec import LoraSpec, MethodSpec, ModelSpec
from llmtrain_trainer.export import export_model
from llmtrain_trainer.model import apply_lora, build_from_config, model_config
from llmtrain_trainer.safetensors_writer import INDEX_FILE, SINGLE_FILE
from llmtrain_trainer.strategies.base import ExportTensor, named_state_tensors
from llmtrain_trainer.tokenizer import byte_level_tokenizer
from peft import PeftModel
from torch import nn
from transformers import AutoModelForCausalLM

from tests.trainer.helpers import TINY_LLAMA

SPEC = ModelSpec(config=TINY_LLAMA, tokenizer="byte-level")
TOKENS = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 8]])


def local_tensors(model: nn.Module) -> list[ExportTensor]:
    """What a strategy gives on a single rank: every tensor already whole."""
    return [
        ExportTensor(name, tuple(t.shape), t.dtype, t.requires_grad, partial(t.detach))
        for name, t in named_state_tensors(model)
    ]


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model.eval()(input_ids=TOKENS).logits
        return out


@pytest.mark.parametrize("max_shard_bytes", [10**9, 60_000], ids=["one-file", "sharded"])
def test_full_export_loads_with_the_same_weights(tmp_path: Path, max_shard_bytes: int) -> None:
    model = build_from_config(model_config(SPEC), torch.float32, meta=False, seed=3)
    export = tmp_path / "export"
    result = export_model(
        local_tensors(model),
        model_config(SPEC),
        MethodSpec(type="full"),
        byte_level_tokenizer(),
        export,
        torch.float32,
        None,
        is_main=True,
        max_shard_bytes=max_shard_bytes,
    )
    assert result is not None and result.path == export
    if max_shard_bytes > 10**6:
        assert (export / SINGLE_FILE).exists() and not (export / INDEX_FILE).exists()
    else:
        index = json.loads((export / INDEX_FILE).read_text())
        assert len(set(index["weight_map"].values())) > 1
    loaded = AutoModelForCausalLM.from_pretrained(export)
    assert json.loads((export / "config.json").read_text())["dtype"] == "float32"
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


def test_bf16_export_casts_each_tensor(tmp_path: Path) -> None:
    model = build_from_config(model_config(SPEC), torch.float32, meta=False, seed=3)
    export_model(
        local_tensors(model), model_config(SPEC), MethodSpec(type="full"), byte_level_tokenizer(),
        tmp_path / "export", torch.bfloat16, None, is_main=True,
    )  # fmt: skip
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.bfloat16)
    expected = model.state_dict()
    for name, param in loaded.state_dict().items():
        assert param.dtype == torch.bfloat16
        torch.testing.assert_close(param, expected[name].to(torch.bfloat16), rtol=0, atol=0)


def test_lora_export_writes_adapters_and_merges_on_request(tmp_path: Path) -> None:
    base = build_from_config(model_config(SPEC), torch.float32, meta=False, seed=3)
    method = MethodSpec(type="lora", lora=LoraSpec(rank=4, alpha=8, merge_on_export=True))
    model = apply_lora(base, method)
    with torch.no_grad():  # non-zero adapters (peft starts B at zero)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    tuned = logits(model)
    tensors = local_tensors(model)
    export = tmp_path / "export"
    base_name = str(tmp_path / "base")  # a local folder: peft looks up the base's config
    model_config(SPEC).save_pretrained(base_name)
    result = export_model(
        tensors, model_config(SPEC), method, byte_level_tokenizer(), export, torch.float32, base_name, True
    )
    assert result is not None and result.merged_path == export / "merged"
    assert (export / "adapter_model.safetensors").exists() and not (export / SINGLE_FILE).exists()
    assert json.loads((export / "adapter_config.json").read_text())["base_model_name_or_path"] == base_name
    fresh = build_from_config(model_config(SPEC), torch.float32, meta=False, seed=3)
    torch.testing.assert_close(logits(PeftModel.from_pretrained(fresh, export)), tuned)
    merged = AutoModelForCausalLM.from_pretrained(export / "merged")
    torch.testing.assert_close(logits(merged), tuned, rtol=1e-5, atol=1e-5)


def test_lora_export_without_merge_gathers_no_frozen_tensor(tmp_path: Path) -> None:
    model = apply_lora(
        build_from_config(model_config(SPEC), torch.float32, meta=False, seed=3), MethodSpec(type="lora")
    )
    gathered: list[str] = []

    def recording(tensor: ExportTensor) -> ExportTensor:
        def gather() -> torch.Tensor | None:
            gathered.append(tensor.name)
            return tensor.gather()

        return ExportTensor(tensor.name, tensor.shape, tensor.dtype, tensor.trainable, gather)

    tensors = [recording(t) for t in local_tensors(model)]
    export_model(
        tensors, model_config(SPEC), MethodSpec(type="lora"), byte_level_tokenizer(), tmp_path / "e",
        torch.float32, None, True,
    )  # fmt: skip
    assert gathered and all("lora_" in name for name in gathered)


@pytest.mark.parametrize("merge", [False, True], ids=["adapters", "merged"])
def test_export_is_readable_by_other_users_of_the_volume(tmp_path: Path, merge: bool) -> None:
    """Another pod (another UID, same fsGroup) loads the model: nothing in the export is owner-only."""
    method = MethodSpec(type="lora", lora=LoraSpec(rank=4, alpha=8, merge_on_export=merge))
    model = apply_lora(build_from_config(model_config(SPEC), torch.float32, meta=False, seed=3), method)
    base_name = str(tmp_path / "base")
    model_config(SPEC).save_pretrained(base_name)
    export = tmp_path / "export"
    export_model(
        local_tensors(model), model_config(SPEC), method, byte_level_tokenizer(), export,
        torch.float32, base_name, is_main=True,
    )  # fmt: skip
    paths = [export, *export.rglob("*")]
    assert len([p for p in paths if p.is_file()]) >= 3
    for path in paths:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o755 if path.is_dir() else 0o644), f"{path.relative_to(tmp_path)}: {oct(mode)}"
