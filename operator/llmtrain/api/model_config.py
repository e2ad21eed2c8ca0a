"""Consistency of an inline `spec.model.config`, judged before anything is created.

The field is preserve-unknown in the CRD (a Hugging Face config has hundreds of optional keys), so
the API server's CEL rules cannot see inside it. A config transformers would refuse, or that builds a
model whose attention shapes cannot work, would otherwise fail only in every training pod after the
Ray cluster is up. These checks cover the shape keys every decoder config shares; anything else is
left to transformers.
"""

from __future__ import annotations

from typing import Any

PATH = ".spec.model.config"
# Keys that size the model: when present, each must be a positive integer.
SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


def config_problems(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(field path, message) for each inconsistency; empty when the config is usable."""
    problems: list[tuple[str, str]] = []
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.strip():
        problems.append(
            (
                f"{PATH}.model_type",
                "required: the Hugging Face architecture name (e.g. llama, qwen2, mistral) that "
                "selects the model class",
            )
        )
    sizes: dict[str, int] = {}
    for key in SIZE_KEYS:
        if key not in config or config[key] is None:
            continue
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append((f"{PATH}.{key}", f"must be a positive integer (got {value!r})"))
        else:
            sizes[key] = value
    hidden, heads = sizes.get("hidden_size"), sizes.get("num_attention_heads")
    if hidden and heads and "head_dim" not in sizes and hidden % heads:
        problems.append(
            (
                f"{PATH}.hidden_size",
                f"hidden_size {hidden} is not divisible by num_attention_heads {heads}; "
                "change one of them or set head_dim",
            )
        )
    kv_heads = sizes.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        problems.append(
            (
                f"{PATH}.num_key_value_heads",
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}: "
                "each key/value head serves a whole group of query heads",
            )
        )
    return problems


# Keys that hold the model's longest sequence: transformers' own name, and the GPT-2 family's.
POSITION_KEYS = ("max_position_embeddings", "n_positions")


def sequence_problems(config: dict[str, Any], max_seq_length: int) -> list[tuple[str, str]]:
    """dataset.maxSeqLength longer than the positions the inline config gives the model: learned
    position tables (GPT-2's) index out of range, rotary ones run past what the model is built for.
    Judged only where the config states its positions (transformers' per-architecture defaults are
    not known without it)."""
    for key in POSITION_KEYS:
        positions = config.get(key)
        if isinstance(positions, int) and not isinstance(positions, bool) and 0 < positions < max_seq_length:
            return [
                (
                    ".spec.dataset.maxSeqLength",
                    f"dataset.maxSeqLength {max_seq_length} is longer than model.config.{key} "
                    f"{positions}: the model has no positions past it; lower dataset.maxSeqLength to "
                    f"at most {positions} or raise model.config.{key}",
                )
            ]
    return []
