"""Padded SFT through the whole loop: the tokens reported are the real tokens every rank read,
summed over ranks, not rank 0's count times the world size."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmtrain_trainer.data import DistributedBatches, build_sequences
from llmtrain_trainer.lifecycle import LoopOptions
from llmtrain_trainer.main import run_training
from llmtrain_trainer.metrics import batch_counts
from llmtrain_trainer.tokenizer import load_tokenizer

from tests.support.trainer import REPO, records, tiny_config

pytestmark = pytest.mark.slow

STEPS = 6


def test_padded_sft_reports_the_real_tokens_of_all_ranks(ray_address: str, storage: Path) -> None:
    config = tiny_config(
        storage,
        "sft-tokens",
        dataset={
            "path": str(REPO / "examples/data/tiny-instructions.jsonl"),
            "format": "instruction",
            "packing": False,
        },
        training={"maxSteps": STEPS, "microBatchSize": 4, "logEverySteps": 5},
        checkpoint={"everySteps": 4},  # a checkpoint between two log steps flushes the counts too
    )
    run_training(config, LoopOptions(log_lines=False))

    tokenizer = load_tokenizer(config.model)
    train = build_sequences(config.dataset, tokenizer, config.training.seed).train
    per_rank = []
    for rank in range(2):
        batches = DistributedBatches(train, 4, rank, 2, config.training.seed, tokenizer.pad_token_id)
        per_rank.append(sum(batch_counts(batches.next_batch()).inputs for _ in range(STEPS)))
    assert per_rank[0] != per_rank[1]  # the ranks' padded batches hold different real tokens

    last = next(r for r in reversed(records(config)) if r.event == "step")
    assert last.step == STEPS and last.tokens_seen == sum(per_rank)
