"""LoRA fine-tuning of a pretrained model (a local path): the adapter export loads with peft, and
the merged export loads with transformers and computes the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.trainer import losses, result, save_tiny_pretrained, tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture
def pretrained(tmp_path: Path) -> Path:
    return save_tiny_pretrained(tmp_path / "base-model")


def test_lora_export_loads_with_peft_and_merged(ray_address: str, storage: Path, pretrained: Path) -> None:
    config = tiny_config(
        storage,
        "lora",
        model={"name": str(pretrained), "config": None, "tokenizer": None},
        method={
            "type": "lora",
            "lora": {
                "rank": 8,
                "alpha": 16,
                "dropout": 0.0,
                "targetModules": ["q_proj", "v_proj"],
                "mergeOnExport": True,
            },
        },
        training={"maxSteps": 20, "learningRate": 0.01},
        checkpoint={"everySteps": 20, "export": True},
    )
    run_training(config, LoopOptions(log_lines=False))
    curve = losses(config)
    assert curve[20] < curve[1]
    export = Path(result(config)["export"])
    assert (export / "adapter_config.json").exists() and (export / "adapter_model.safetensors").exists()
    assert not (export / "model.safetensors").exists(), "the adapter export holds the adapter only"

    base = AutoModelForCausalLM.from_pretrained(pretrained)
    tuned = PeftModel.from_pretrained(base, export).eval()
    merged = AutoModelForCausalLM.from_pretrained(export / "merged").eval()
    tokenizer = AutoTokenizer.from_pretrained(export)
    batch = tokenizer("Once upon a time, there was a cat.", return_tensors="pt")
    with torch.no_grad():
        adapted = tuned(**batch).logits
        folded = merged(**batch).logits
        original = AutoModelForCausalLM.from_pretrained(pretrained)(**batch).logits
        generated = tuned.generate(**batch, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] == batch["input_ids"].shape[1] + 8
    assert torch.allclose(adapted, folded, atol=1e-4), "merged weights = base + adapter"
    assert not torch.allclose(adapted, original, atol=1e-3), "the adapter was trained"
