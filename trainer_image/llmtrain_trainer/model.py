"""Models: resolve the architecture, build it (full, on meta, or under ZeRO-3), add LoRA, count FLOPs.

The strategies decide *where* weights materialise; this module only knows how to describe and
create a model. Weights come from a pretrained checkpoint (hub id or path) or, for an inline config,
from a seeded random initialisation that is the same on every rank and every world size.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from llmtrain.api.spec import DatasetSpec, LoraSpec, MethodSpec, ModelSpec
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel


class ModelError(ValueError):
    """The model cannot be resolved or built; the message names the offending field."""


def hf_token() -> str | None:
    """HF_TOKEN from the environment (the pod gets it from a secretKeyRef), or None."""
    return os.environ.get("HF_TOKEN") or None


def is_pretrained(spec: ModelSpec) -> bool:
    return spec.name is not None


def model_config(spec: ModelSpec) -> PretrainedConfig:
    """The architecture: the inline config, or the pretrained model's config.json."""
    if spec.config is not None:
        fields = dict(spec.config)
        model_type = fields.pop("model_type", None)
        if not model_type:
            raise ModelError("model.config must contain model_type (e.g. llama)")
        try:
            return AutoConfig.for_model(str(model_type), **fields)
        except ValueError as exc:
            raise ModelError(
                f"model.config.model_type {model_type!r} is not an architecture transformers knows"
            ) from exc
    assert spec.name is not None
    try:
        config: PretrainedConfig = AutoConfig.from_pretrained(
            spec.name, revision=spec.revision, trust_remote_code=spec.trust_remote_code, token=hf_token()
        )
    except (OSError, ValueError) as exc:
        where = "path" if Path(spec.name).is_absolute() else "hub id or path"
        raise ModelError(
            f"model.name {spec.name!r}: cannot load its config as a {where} ({first_line(exc)})"
        ) from exc
    return config


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_causal_lm(config: PretrainedConfig) -> None:
    """Fail early when transformers has no causal-LM head for this architecture."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not getattr(config, "auto_map", None):
        raise ModelError(
            f"model type {config.model_type!r} has no causal language-model head in transformers"
        )


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Create parameters on the meta device but buffers for real.

    Non-persistent buffers (rotary frequencies) are computed in `__init__` and are in no checkpoint,
    so they must be real; parameters are only placeholders until the strategy shards them.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            meta = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
            module._parameters[name] = meta

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_from_config(
    config: PretrainedConfig, dtype: torch.dtype, *, meta: bool, seed: int
) -> PreTrainedModel:
    """The architecture with seeded random weights, or with meta parameters when `meta`."""
    torch.manual_seed(seed)
    if meta:
        with parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    assert isinstance(model, PreTrainedModel)
    return model


def load_pretrained(folder: Path, spec: ModelSpec, dtype: torch.dtype) -> PreTrainedModel:
    """`from_pretrained` from a local folder (weights.py), on CPU; under ZeRO-3's zero.Init when an
    HfDeepSpeedConfig is alive, which makes it a collective that every rank must enter together."""
    model = AutoModelForCausalLM.from_pretrained(
        folder, trust_remote_code=spec.trust_remote_code, dtype=dtype
    )
    assert isinstance(model, PreTrainedModel)
    return model


def apply_lora(model: nn.Module, method: MethodSpec) -> nn.Module:
    """Wrap with peft LoRA adapters when method.type is lora; freezes the base weights."""
    if method.type != "lora":
        return model
    from peft import LoraConfig, get_peft_model

    lora = method.lora or LoraSpec()
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ModelError(f"method.lora.targetModules {lora.target_modules}: {first_line(exc)}") from exc


def hold_frozen_in(model: nn.Module, dtype: torch.dtype) -> int:
    """Store every frozen floating-point parameter (a LoRA base) in the compute dtype; return how
    many parameters that changed.

    A frozen weight has no gradient and no optimizer state, so it needs no fp32 master: kept in
    fp32 it costs 4 bytes a parameter instead of 2, and FSDP2's MixedPrecisionPolicy casts every
    fp32 shard to the compute dtype before each all-gather (a parameter already in `param_dtype`
    is gathered as it is). Trainable parameters (the adapters) keep their fp32 masters. The
    tensor is replaced in place (`.data`), so tied parameters stay one parameter; meta parameters
    only change their dtype."""
    changed = 0
    for param in model.parameters():  # a tied tensor once
        if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
            param.data = param.detach().to(dtype)
            changed += 1
    return changed


def reset_lora_parameters(model: nn.Module) -> None:
    """Re-initialise adapters after their storage was allocated (A: kaiming, B: zeros)."""
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            for adapter in module.lora_A:
                module.reset_lora_parameters(adapter, init_lora_weights=True)  # type: ignore[no-untyped-call]


def enable_gradient_checkpointing(model: nn.Module, every_blocks: int = 1) -> None:
    """Recompute transformer blocks in backward (training.gradientCheckpointing): all of them, or
    with `every_blocks` N > 1 blocks 0, N, 2N, ... only (training.checkpointEveryBlocks), the
    others keeping their activations: less recomputation for more memory."""
    base = unwrap_peft(model)
    assert isinstance(base, PreTrainedModel)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[no-untyped-call]
    base.config.use_cache = False
    for index, block in enumerate(transformer_blocks(model)):
        # transformers' checkpointed layers read this flag on every call.
        block.gradient_checkpointing = index % every_blocks == 0  # type: ignore[assignment]


def compile_wanted(setting: bool | None, on_gpu: bool) -> bool:
    """training.compile as set, else on GPUs only: on an H200 compiled blocks gave 39.7% vs 33.3%
    MFU (micro-batch 4) and 50.8% vs 37.7% (8); on a CPU the compile time outweighs a short run."""
    return on_gpu if setting is None else setting


_DYNAMO_LOGGER = "torch._dynamo.convert_frame"
"""Where dynamo logs, at WARNING, each frame whose compilation failed and that it runs eagerly
instead (config.suppress_errors; torch/_dynamo/convert_frame.py)."""


class CompileFailures(logging.Handler):
    """The compilations that failed and fell back to eager, one line each, for the notice."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # The cause is the exception dynamo suppressed; its message leads with the frame's name.
        cause = record.exc_info[1] if record.exc_info else None
        text = str(cause) if cause is not None else record.getMessage()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        self.failures.append(" ".join(lines[:2]) if lines else record.levelname)

    def notice(self) -> str | None:
        """What the user reads in status.progress.notices, or None when everything compiled."""
        if not self.failures:
            return None
        return (
            "training.compile: torch.compile failed for some blocks, which run eagerly instead (same "
            f"results, slower; training.compile: false skips compiling). First error: {self.failures[0]}"
        )


def compile_blocks(model: nn.Module, backend: Any = "inductor") -> CompileFailures:
    """Compile each transformer block's forward in place (training.compile).

    `Module.compile` keeps the module itself, so parameter names, state dicts (checkpoints, the
    export) and FSDP2's per-block sharding are unchanged; the blocks are what torchtitan compiles.
    Compilation happens at a block's first call; one that fails must not fail the job, so dynamo
    runs that block eagerly (`suppress_errors`: the same collectives in the same order on every
    rank, unlike a retry of the step) and the returned handler records the failure."""
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    failures = CompileFailures()
    logging.getLogger(_DYNAMO_LOGGER).addHandler(failures)
    for block in transformer_blocks(model):
        block.compile(backend=backend)
    return failures


FLEX_ATTENTION = "flex_attention"


def packed_attention(dataset: DatasetSpec, on_gpu: bool, supports_flex: bool) -> str | None:
    """The attention kernel for packed instruction/chat rows, or None for transformers' default.

    Rows of several examples carry `position_ids` that restart at each example; transformers turns
    the restarts into a document mask (`masking_utils.find_packed_sequence_indices`). On GPUs,
    flex_attention gets it as a BlockMask and skips the blocks between examples; sdpa would get a
    dense batch x seq x seq mask and compute every block. On CPUs flex_attention has no backward
    (torch 2.13 raises NotImplementedError), so sdpa with the derived mask it is. Packed text and
    padded rows have one causal sequence per row, for which sdpa's plain causal kernel is best.
    """
    if dataset.packs_examples and on_gpu and supports_flex:
        return FLEX_ATTENTION
    return None


def use_packed_attention(model: nn.Module, dataset: DatasetSpec, on_gpu: bool) -> str:
    """Switch the model to `packed_attention`'s choice; returns the kernel the model now uses."""
    base = unwrap_peft(model)
    assert isinstance(base, PreTrainedModel)
    choice = packed_attention(dataset, on_gpu, bool(getattr(base, "_supports_flex_attn", False)))
    if choice is not None:
        base.set_attn_implementation(choice)
    return str(base.config._attn_implementation)


def packed_row_length(dataset: DatasetSpec, attention: str) -> int:
    """What `collate` rounds row lengths up to. flex_attention compiles for each shape
    (transformers compiles it with dynamic=False); padding packed rows, nearly full anyway, to
    maxSeqLength keeps one shape instead of a recompilation per new longest row."""
    return dataset.max_seq_length if attention == FLEX_ATTENTION else 8


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated decoder layers, found through transformers' `_no_split_modules` names."""
    base = unwrap_peft(model)
    names = set(getattr(base, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:  # fall back to the usual container of layers
        layers = getattr(getattr(base, "model", base), "layers", None)
        blocks = list(layers) if isinstance(layers, nn.ModuleList) else []
    return blocks


def hf_parameter_name(name: str) -> str:
    """A parameter's name in the pretrained checkpoint (drops peft's wrapper prefixes)."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


# ----------------------------------------------------------------------------- FLOPs


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(all parameters, trainable parameters), counting shared (tied) tensors once."""
    seen: set[int] = set()
    total = trainable = 0
    for param in model.parameters():
        key = id(param)
        if key in seen:
            continue
        seen.add(key)
        numel = _global_numel(param)
        total += numel
        trainable += numel if param.requires_grad else 0
    return total, trainable


def _global_numel(param: torch.Tensor) -> int:
    ds_numel = getattr(param, "ds_numel", None)  # ZeRO-3 partitioned parameter
    return int(ds_numel) if ds_numel is not None else param.numel()


@dataclass(frozen=True)
class TrainingFlops:
    """The model FLOPs of a training step, from the work the step really does.

    MFU counts useful model work only (the PaLM convention): padding positions and activation
    recomputation are not credited, and neither tokens nor FLOPs include padding. Attention is
    credited over the full t×t score matrix, as PaLM and `torch.utils.flop_counter` count it (a
    causal kernel may skip half of it). What is counted:

    - matmuls, per real input token: 6 FLOPs per trainable weight (forward, input gradient,
      weight gradient) and 4 per frozen one (a LoRA base computes no weight gradient); the input
      embedding is a lookup and counts nothing, a tied output head is a matmul and counts;
    - attention, per pair of (query, key) positions of one sequence: 12·L·d (QKᵀ and AV, 4·d
      forward and 8·d backward over all layers; d = heads × head_dim), summed over each
      sequence's real length squared. A padded row of t real tokens thus counts t², a packed row
      of T tokens T².

    One approximation: the frozen projections of the first block under LoRA see an input that
    needs no gradient, so autograd skips their input gradient; that is 1/L of them and ignored.
    """

    per_token: float
    per_attended_pair: float

    def of(self, tokens: float, attended_pairs: float) -> float:
        """FLOPs for `tokens` real input tokens whose sequences sum to `attended_pairs` (Σ t²)."""
        return self.per_token * tokens + self.per_attended_pair * attended_pairs


def training_flops(config: PretrainedConfig, model: nn.Module) -> TrainingFlops:
    """TrainingFlops of `model` (any wrapper: DDP, DeepSpeed, peft; sharded or not)."""
    frozen, trainable = _matmul_parameters(model)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    # The width of the attention products: heads × head_dim, which some models set apart from
    # the hidden size (Gemma, Qwen3); the hidden size otherwise.
    width = int(getattr(config, "hidden_size", 0) or 0)
    heads, head_dim = getattr(config, "num_attention_heads", None), getattr(config, "head_dim", None)
    if heads and head_dim:
        width = int(heads) * int(head_dim)
    return TrainingFlops(per_token=4.0 * frozen + 6.0 * trainable, per_attended_pair=12.0 * layers * width)


def _matmul_parameters(model: nn.Module) -> tuple[int, int]:
    """(frozen, trainable) counts of the parameters that take part in matmuls: all but those
    owned only by an embedding (a lookup); a tied head shares the embedding's tensor and counts."""
    used: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if not isinstance(module, nn.Embedding):
            used.update({id(p): p for p in module._parameters.values() if p is not None})
    frozen = sum(_global_numel(p) for p in used.values() if not p.requires_grad)
    trainable = sum(_global_numel(p) for p in used.values() if p.requires_grad)
    return frozen, trainable
