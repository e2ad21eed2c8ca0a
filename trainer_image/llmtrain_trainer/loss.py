"""The training objective: summed next-token cross-entropy, and the count of tokens it covers.

Both follow one convention (position t predicts labels[t + 1]; IGNORE_INDEX labels count for
nothing), so they live together: the loop divides the one by the other for a step's mean loss and
scales gradients by the count, and a strategy's `forward_backward` computes the sum.

A 128k vocabulary makes the logits the largest activation of a step: an 8B Llama at seq 2048 and
micro-batch 4 has 4 GiB of them in fp32, plus their gradient. `chunked_token_loss_sum` therefore
computes the loss from the final hidden states a chunk of positions at a time (head → fp32 → summed
cross-entropy) and recomputes each chunk's logits in backward, so at most one chunk of logits is
ever alive. `head_loss_forward` runs it inside the causal LM's own forward, where FSDP2's and
ZeRO-3's hooks have gathered the (possibly tied) head weight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from llmtrain.memory import LOSS_CHUNK_TOKENS
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from llmtrain_trainer.data import IGNORE_INDEX

# Config fields of architectures whose forward changes the head's output before the loss (Gemma 2's
# soft-capping, Cohere's and Granite's scaling): they keep the whole-logits path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """The label each position predicts (labels[t + 1]); the last position predicts nothing."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy in fp32 from whole logits; position t predicts labels[t + 1]."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        shifted_labels(labels).reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def _chunk_loss(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits: torch.Tensor = head(hidden)
    return F.cross_entropy(
        logits.float(),
        targets,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def chunked_token_loss_sum(
    hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, chunk_tokens: int = LOSS_CHUNK_TOKENS
) -> torch.Tensor:
    """`token_loss_sum(head(hidden), labels)`, holding at most `chunk_tokens` positions' logits.

    Under autograd each chunk is checkpointed: only its slice of `hidden` is saved, and backward
    recomputes its logits (one more head matmul) right before using them."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = shifted_labels(labels).reshape(-1)
    total = flat.new_zeros((), dtype=torch.float32)
    for start in range(0, flat.shape[0], chunk_tokens):
        rows, wanted = flat[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if torch.is_grad_enabled():
            loss = checkpoint(_chunk_loss, head, rows, wanted, use_reentrant=False)
        else:
            loss = _chunk_loss(head, rows, wanted)
        total = total + loss
    return total


def causal_lm(model: nn.Module) -> PreTrainedModel | None:
    """The Hugging Face causal LM inside a strategy's wrappers (DDP, DeepSpeed, peft), when its
    loss can be computed in chunks: a decoder, then a head whose output is the logits."""
    found = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if found is None or _head(found) is None:
        return None
    if any(getattr(found.config, name, None) is not None for name in _LOGIT_TRANSFORMS):
        return None
    if getattr(found, found.base_model_prefix, None) is None:
        return None
    return found


def _head(lm: PreTrainedModel) -> nn.Module | None:
    head: nn.Module | None = lm.get_output_embeddings()  # type: ignore[no-untyped-call]
    return head


@contextmanager
def head_loss_forward(
    lm: PreTrainedModel, labels: torch.Tensor, chunk_tokens: int = LOSS_CHUNK_TOKENS
) -> Iterator[None]:
    """While open, `lm`'s forward returns the chunked summed loss as `loss` instead of logits.

    The wrappers around `lm` (FSDP2's root hooks, DDP, the DeepSpeed engine, peft) call it as
    usual, so they gather, reduce and reshard the head and embedding as for a whole-logits forward.
    """
    decoder: nn.Module = getattr(lm, lm.base_model_prefix)
    head = _head(lm)
    assert head is not None

    def forward(**kwargs: Any) -> CausalLMOutputWithPast:
        for unused in ("labels", "output_attentions", "output_hidden_states", "return_dict"):
            kwargs.pop(unused, None)
        hidden: torch.Tensor = decoder(**{k: v for k, v in kwargs.items() if v is not None})[0]
        return CausalLMOutputWithPast(loss=chunked_token_loss_sum(hidden, head, labels, chunk_tokens))

    previous = lm.__dict__.get("forward")
    patched: Callable[..., Any] = forward
    lm.forward = patched  # type: ignore[method-assign]
    try:
        yield
    finally:
        if previous is None:
            del lm.forward
        else:
            lm.forward = previous  # type: ignore[method-assign]


def trained_tokens(labels: torch.Tensor) -> int:
    """Tokens that contribute to the loss in a micro-batch (the first label is never predicted)."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())
