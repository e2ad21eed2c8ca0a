"""The Hugging Face export: safetensors + config + tokenizer, streamed to disk by rank 0 at the end.

It lives in `<run>/export`, beside the checkpoints and never reported to Ray Train, so a later
resume cannot mistake it for a training checkpoint. It is written to a temporary folder and renamed
into place, so a reader never sees half an export.

- full fine-tune: `export/` is a model folder (`AutoModelForCausalLM.from_pretrained`).
- LoRA: `export/` is a peft adapter folder (`PeftModel.from_pretrained(base, export)`), and with
  `mergeOnExport` `export/merged/` holds the base model with the adapter merged in.

Memory: tensors are gathered one at a time (a collective every rank joins, `Strategy.export_tensors`),
cast, written and dropped, so rank 0 never holds the model (a 70B model is 280 GB in fp32). A
LoRA export gathers the adapters alone; the frozen base is gathered, tensor by tensor, only to merge.
"""

from __future__ import annotations

import copy
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
from llmtrain_trainer.safetensors_writer import (
    DEFAULT_MAX_SHARD_BYTES,
    StreamingSafetensorsWriter,
    TensorEntry,
)
from llmtrain_trainer.strategies.base import ExportTensor

log = logging.getLogger(__name__)
MERGED_DIR = "merged"


@dataclass(frozen=True)
class ExportResult:
    path: Path
    merged_path: Path | None = None


def export_model(
    tensors: list[ExportTensor],
    hf_config: PretrainedConfig,
    method: MethodSpec,
    tokenizer: PreTrainedTokenizerBase,
    export_dir: Path,
    dtype: torch.dtype,
    base_model_name: str | None,
    is_main: bool,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> ExportResult | None:
    """Write the export atomically. Every rank calls it (the gathers are collectives); rank 0 writes
    and gets the result, the others None."""
    staging: Path | None = None
    if is_main:
        export_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=export_dir.parent))
    try:
        merged = _write(
            tensors, hf_config, method, tokenizer, staging, dtype, base_model_name, max_shard_bytes
        )
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if staging is None:
        return None
    share_with_group(staging)
    if export_dir.exists():
        shutil.rmtree(export_dir)
    staging.rename(export_dir)
    log.info("exported to %s", export_dir)
    return ExportResult(export_dir, export_dir / MERGED_DIR if merged else None)


def share_with_group(folder: Path) -> None:
    """Folders 0755, files 0644: the model on a shared volume is loaded by other pods (serving,
    evaluation) that run as another UID in the same fsGroup; `mkdtemp` and some writers leave
    owner-only modes (0700/0600) that would lock them out."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def _write(
    tensors: list[ExportTensor],
    hf_config: PretrainedConfig,
    method: MethodSpec,
    tokenizer: PreTrainedTokenizerBase,
    staging: Path | None,
    dtype: torch.dtype,
    base_model_name: str | None,
    max_shard_bytes: int,
) -> bool:
    """Everything but the atomic rename; returns whether a merged model was written."""
    skeleton = meta_skeleton(hf_config, method)  # on the meta device: names, LoRA scalings, configs
    if method.type != "lora":
        _stream_model(tensors, skeleton, {}, staging, dtype, max_shard_bytes)
        if staging is not None:
            tokenizer.save_pretrained(str(staging))
        return False
    # The adapters are small (r·(in+out) per adapted matrix): gathered whole, written last, after
    # the merge's collectives, so a failed write on rank 0 leaves no rank waiting.
    adapters = {t.name: t.gather() for t in tensors if t.trainable}
    merge = (method.lora or LoraSpec()).merge_on_export
    if merge:
        merged = staging / MERGED_DIR if staging is not None else None
        if merged is not None:
            merged.mkdir()
        frozen = [t for t in tensors if not t.trainable]
        _stream_model(frozen, skeleton, adapters, merged, dtype, max_shard_bytes)
        if merged is not None:
            tokenizer.save_pretrained(str(merged))
    if staging is not None:
        assert isinstance(skeleton, PeftModel)
        skeleton.peft_config["default"].base_model_name_or_path = base_model_name
        weights = {name: _cast(value, dtype) for name, value in adapters.items() if value is not None}
        skeleton.save_pretrained(str(staging), safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(str(staging))
    return merge


def meta_skeleton(hf_config: PretrainedConfig, method: MethodSpec) -> nn.Module:
    """The model as trained (LoRA-wrapped for method lora) with every parameter on the meta device."""
    model: nn.Module = models.build_from_config(hf_config, torch.float32, meta=True, seed=0)
    with models.parameters_on_meta():
        return models.apply_lora(model, method)


def _stream_model(
    tensors: list[ExportTensor],
    skeleton: nn.Module,
    adapters: dict[str, torch.Tensor | None],
    directory: Path | None,
    dtype: torch.dtype,
    max_shard_bytes: int,
) -> None:
    """Gather, merge any adapter into, cast and write each tensor under its Hugging Face name.

    On rank 0 a write error is kept until every gather is done, so the other ranks are not left
    waiting in a collective; then it is raised."""
    entries = [
        TensorEntry(
            models.hf_parameter_name(t.name), t.shape, dtype if t.dtype.is_floating_point else t.dtype
        )
        for t in tensors
    ]
    writer = StreamingSafetensorsWriter(directory, entries, max_shard_bytes) if directory else None
    failure: BaseException | None = None
    for tensor, entry in zip(tensors, entries, strict=True):
        value = tensor.gather()
        if writer is None or value is None or failure is not None:
            continue
        try:
            writer.write(entry.name, _cast(_merged(tensor.name, value, skeleton, adapters), entry.dtype))
        except Exception as exc:  # re-raised below, after the collectives
            failure = exc
        del value
    if failure is not None:
        raise failure
    if writer is not None and directory is not None:
        writer.close()
        _save_configs(skeleton, directory, dtype)


def _merged(
    name: str, weight: torch.Tensor, skeleton: nn.Module, adapters: dict[str, torch.Tensor | None]
) -> torch.Tensor:
    """A LoRA base weight plus scaling·B·A in fp32 (peft's merge); any other tensor unchanged."""
    if not name.endswith(".base_layer.weight"):
        return weight
    module = name.removesuffix(".base_layer.weight")
    a, b = adapters.get(f"{module}.lora_A.default.weight"), adapters.get(f"{module}.lora_B.default.weight")
    if a is None or b is None:
        return weight
    scalings: dict[str, float] = getattr(skeleton.get_submodule(module), "scaling")  # noqa: B009
    scaling = float(scalings["default"])
    return weight.float() + scaling * (b.float() @ a.float())


def _export_dtype(source: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    return dtype if source.is_floating_point else source


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _save_configs(skeleton: nn.Module, directory: Path, dtype: torch.dtype) -> None:
    """config.json (with dtype and architecture) and generation_config.json, as `save_pretrained`."""
    base = models.unwrap_peft(skeleton)
    assert isinstance(base, PreTrainedModel)
    config = copy.deepcopy(base.config)
    config.dtype = str(dtype).removeprefix("torch.")
    config.architectures = [type(base).__name__]
    config.save_pretrained(str(directory))
    if base.can_generate() and base.generation_config is not None:
        base.generation_config.save_pretrained(str(directory))
