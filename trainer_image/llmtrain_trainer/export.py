"""The Hugging Face export: safetensors + config + tokenizer, written by rank 0 at the end.

It lives in `<run>/export`, beside the checkpoints and never reported to Ray Train, so a later
resume cannot mistake it for a training checkpoint. It is written to a temporary folder and renamed
into place, so a reader never sees half an export.

- full fine-tune: `export/` is a model folder (`AutoModelForCausalLM.from_pretrained`).
- LoRA: `export/` is a peft adapter folder (`PeftModel.from_pretrained(base, export)`), and with
  `mergeOnExport` `export/merged/` holds the base model with the adapter merged in.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from llmtrain.api.spec import LoraSpec, MethodSpec
from peft import PeftModel
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from llmtrain_trainer import model as models

log = logging.getLogger(__name__)
MERGED_DIR = "merged"


@dataclass(frozen=True)
class ExportResult:
    path: Path
    merged_path: Path | None = None


def _rebuild(
    hf_config: PretrainedConfig, method: MethodSpec, state: dict[str, torch.Tensor], dtype: torch.dtype
) -> nn.Module:
    """The trained model on CPU, from the gathered full state dict (no second random init)."""
    model: nn.Module = models.build_from_config(hf_config, torch.float32, meta=True, seed=0)
    with models.parameters_on_meta():
        model = models.apply_lora(model, method)
    state = {key: value.to(dtype) if value.is_floating_point() else value for key, value in state.items()}
    model.load_state_dict(state, strict=False, assign=True)
    base = models.unwrap_peft(model)
    if isinstance(base, PreTrainedModel):
        base.tie_weights()
    missing = [name for name, param in model.named_parameters() if param.device.type == "meta"]
    if missing:
        raise RuntimeError(f"export: the gathered state has no value for {missing[:5]}")
    return model


def export_model(
    state: dict[str, torch.Tensor],
    hf_config: PretrainedConfig,
    method: MethodSpec,
    tokenizer: PreTrainedTokenizerBase,
    export_dir: Path,
    dtype: torch.dtype,
    base_model_name: str | None,
) -> ExportResult:
    """Write the export atomically (rank 0 only)."""
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=export_dir.parent))
    try:
        model = _rebuild(hf_config, method, state, dtype)
        model.eval()
        merged: Path | None = None
        if method.type == "lora":
            assert isinstance(model, PeftModel)
            model.peft_config["default"].base_model_name_or_path = base_model_name
            model.save_pretrained(str(staging), safe_serialization=True)  # adapter only
            if (method.lora or LoraSpec()).merge_on_export:
                merged = staging / MERGED_DIR
                full = model.merge_and_unload()
                full.save_pretrained(str(merged), safe_serialization=True)
                tokenizer.save_pretrained(str(merged))
        else:
            assert isinstance(model, PreTrainedModel)
            model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        if export_dir.exists():
            shutil.rmtree(export_dir)
        staging.rename(export_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported to %s", export_dir)
    return ExportResult(export_dir, export_dir / MERGED_DIR if merged else None)
