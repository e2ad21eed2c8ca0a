"""training.checkpointEveryBlocks: with N > 1 only blocks 0, N, 2N, ... are recomputed in backward,
and the gradients are those of a model that recomputes nothing."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from llmtrain_trainer.model import enable_gradient_checkpointing, transformer_blocks
from transformers import LlamaConfig, LlamaForCausalLM


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).train()


def _step(model: LlamaForCausalLM) -> tuple[Counter[int], dict[str, torch.Tensor]]:
    """MLP calls per block over one forward and backward (a recomputed block runs twice), and the
    gradients."""
    calls: Counter[int] = Counter()
    for index, block in enumerate(transformer_blocks(model)):
        # A pre-hook: recomputation stops early, once the last saved tensor is rebuilt.
        block.mlp.register_forward_pre_hook(lambda *_, i=index: calls.update([i]))
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    return calls, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("every", "recomputed"), [(1, [0, 1, 2, 3, 4]), (2, [0, 2, 4]), (3, [0, 3]), (8, [0])]
)
def test_every_nth_block_is_recomputed_and_gradients_are_unchanged(every: int, recomputed: list[int]) -> None:
    _, expected = _step(_model())
    model = _model()
    enable_gradient_checkpointing(model, every)
    calls, grads = _step(model)
    assert sorted(i for i, n in calls.items() if n == 2) == recomputed
    assert all(n in (1, 2) for n in calls.values()) and len(calls) == 5
    assert grads.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
