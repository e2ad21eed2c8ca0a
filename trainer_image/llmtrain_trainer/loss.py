"""The training objective: summed next-token cross-entropy, and the count of tokens it covers.

Both follow one convention (position t predicts labels[t + 1]; IGNORE_INDEX labels count for
nothing), so they live together: the loop divides the one by the other for a step's mean loss and
scales gradients by the count, and a strategy's `forward_backward` computes the sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmtrain_trainer.data import IGNORE_INDEX


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy in fp32; position t predicts labels[t + 1]."""
    shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        shifted.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def trained_tokens(labels: torch.Tensor) -> int:
    """Tokens that contribute to the loss in a micro-batch (the first label is never predicted)."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())
