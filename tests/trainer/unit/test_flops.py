"""MFU's FLOPs formula against the FLOPs torch really runs (`FlopCounterMode`), one forward and
backward of the demo's tiny Llama: full fine-tuning, LoRA, and a padded instruction batch.

CPU SDPA's fused kernel has no FLOP formula in `FlopCounterMode`, so attention runs on the math
backend here, which is plain matmuls over the full t×t score matrix: the convention the formula
follows (model.TrainingFlops).
"""

from __future__ import annotations

import pytest
import torch
from llmtrain.api.spec import MethodSpec, ModelSpec
from llmtrain_trainer.data import IGNORE_INDEX, collate
from llmtrain_trainer.loss import token_loss_sum
from llmtrain_trainer.metrics import batch_counts
from llmtrain_trainer.model import apply_lora, build_from_config, model_config, training_flops
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from tests.support.trainer import TINY_LLAMA

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOLERANCE = 0.05


def tiny_model(method: str, **overrides: int) -> tuple[nn.Module, object]:
    config = model_config(ModelSpec(config={**TINY_LLAMA, **overrides}, tokenizer="byte-level"))
    model = build_from_config(config, torch.float32, meta=False, seed=0)
    lora = {"lora": {"targetModules": ALL_LINEAR, "dropout": 0.0}} if method == "lora" else {}
    return apply_lora(model, MethodSpec.model_validate({"type": method, **lora})), config


def measured_flops(model: nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """FLOPs torch counts over one forward and backward of the training loss."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
        token_loss_sum(logits, batch["labels"]).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def packed_batch(rows: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 384, (rows, length), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.mark.parametrize(
    ("method", "overrides"),
    [("full", {}), ("lora", {}), ("full", {"head_dim": 32})],  # 4 heads × 32 wider than hidden 64
    ids=["full", "lora", "wide-heads"],
)
def test_step_flops_match_what_torch_counts(method: str, overrides: dict[str, int]) -> None:
    """LoRA's frozen base does no weight-gradient matmul: 4 FLOPs per frozen weight, not 6."""
    model, config = tiny_model(method, **overrides)
    batch = packed_batch(4, 128)
    counts = batch_counts(batch)
    estimate = training_flops(config, model).of(counts.inputs, counts.attended_pairs)
    assert estimate == pytest.approx(measured_flops(model, batch), rel=TOLERANCE)


def test_padded_batches_are_credited_for_their_real_tokens_only() -> None:
    """A padded batch counts the FLOPs of its sequences run unpadded: padding is not model work."""
    model, config = tiny_model("full")
    generator = torch.Generator().manual_seed(2)
    lengths = [12, 20, 40, 64]
    examples = [
        {"input_ids": ids, "labels": [IGNORE_INDEX] * 8 + ids[8:]}
        for ids in (torch.randint(0, 384, (n,), generator=generator).tolist() for n in lengths)
    ]
    padded = collate(examples, pad_id=0)
    assert padded["input_ids"].shape == (4, 64) and "attention_mask" in padded

    counts = batch_counts(padded)
    estimate = training_flops(config, model).of(counts.inputs, counts.attended_pairs)
    unpadded = sum(measured_flops(model, collate([example], pad_id=0, multiple_of=1)) for example in examples)
    assert counts.inputs == sum(lengths)
    assert estimate == pytest.approx(unpadded, rel=TOLERANCE)
    assert estimate < 0.8 * measured_flops(model, padded)  # what the padded batch computes


def test_counts_refuse_a_device_batch() -> None:
    """Counting on a device tensor would sync the host on every micro-batch."""
    with pytest.raises(ValueError, match="CPU copy"):
        batch_counts({k: v.to("meta") for k, v in packed_batch(2, 8).items()})


def test_packed_examples_are_credited_for_their_own_attention_blocks() -> None:
    """Packed SFT rows attend block-diagonally (positions restart per example): the attention
    FLOPs are those of each example alone, not of the whole row."""
    model, config = tiny_model("full")
    lengths = [10, 20, 34]
    ids = torch.randint(0, 384, (1, sum(lengths)), generator=torch.Generator().manual_seed(3))
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    row = {"input_ids": ids, "labels": ids.clone(), "position_ids": positions}

    counts = batch_counts(row)
    assert (counts.inputs, counts.attended_pairs) == (64, sum(n * n for n in lengths))
    assert counts.trained == 63, "every label but the row's first is predicted"
    estimate = training_flops(config, model).of(counts.inputs, counts.attended_pairs)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    alone = sum(
        measured_flops(model, {"input_ids": ids[:, s : s + n], "labels": ids[:, s : s + n]})
        for s, n in zip(starts, lengths, strict=True)
    )
    assert estimate == pytest.approx(alone, rel=TOLERANCE)
