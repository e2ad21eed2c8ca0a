"""One FSDP2 step on 2 gloo workers gives the gradients of a single-process step on the same batch.

This is what catches pytorch#162338 (gloo's AVG reduction returning summed gradients) and any
mistake in how the loop scales the loss across ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.data import DistributedBatches, build_sequences
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.loss import trained_tokens
from llmtrain_trainer.strategies.fsdp import FsdpStrategy
from llmtrain_trainer.tokenizer import load_tokenizer

from tests.support.trainer import reference_gradients, run_on_workers, tiny_config

pytestmark = pytest.mark.slow

RELATIVE_TOLERANCE = 1e-5


def one_step_gradients(loop_config: dict[str, Any]) -> None:
    """Per worker: one FSDP2 micro-batch step; rank 0 compares with a single-process reference."""
    config = TrainerConfig.model_validate(loop_config["trainer_config"])
    env = WorkerEnv.from_ray_context()
    tokenizer = load_tokenizer(config.model)
    data = build_sequences(config.dataset, tokenizer, config.training.seed)
    strategy = FsdpStrategy(config, env, total_steps=10)
    initial = strategy.full_state_dict()

    def batch_of(rank: int) -> dict[str, torch.Tensor]:
        return DistributedBatches(
            data.train, config.training.micro_batch_size, rank, env.world_size, 0, tokenizer.pad_token_id
        ).next_batch()

    batches = [batch_of(rank) for rank in range(env.world_size)]
    step_tokens = sum(trained_tokens(b["labels"]) for b in batches)
    strategy.forward_backward(batches[env.rank], env.world_size / step_tokens, last_micro_batch=True)
    sharded = {name: param.grad.full_tensor() for name, param in strategy.model.named_parameters()}

    if env.is_main:
        assert initial is not None
        expected = reference_gradients(config, initial, batches, step_tokens)
        report = {}
        for name, grad in sharded.items():
            want = expected[name]
            report[name] = {
                "max_abs_diff": float((grad - want).abs().max()),
                "max_abs_ref": float(want.abs().max()),
                "ratio": float(grad.norm() / want.norm()),
            }
        mesh = next(strategy.model.parameters()).device_mesh  # type: ignore[attr-defined]
        Path(loop_config["report_path"]).write_text(json.dumps({"mesh": list(mesh.shape), "grads": report}))


@pytest.mark.parametrize(
    ("workers", "fsdp"),
    [(2, {}), (4, {"hybridShardSize": 2})],
    ids=["fsdp-2", "hsdp-2x2"],
)
def test_fsdp_gradients_match_single_process(
    ray_address: str, storage: Path, workers: int, fsdp: dict[str, Any]
) -> None:
    """HSDP (2 replicas of 2 shards) must average over all 4 ranks: shards reduce-scatter, then
    the replicas all-reduce."""
    config = tiny_config(
        storage,
        "grads",
        scaling={"numWorkers": workers, "cpusPerWorker": 2 / workers},
        strategy={"fsdp": fsdp},
    )
    report_path = storage / "gradients.json"
    run_on_workers(one_step_gradients, config, report_path=str(report_path))
    written = json.loads(report_path.read_text())
    assert written["mesh"] == ([workers // 2, 2] if fsdp else [workers])
    report = written["grads"]
    assert len(report) == 20  # 2 blocks × 9 tensors, the final norm and the (tied) embedding
    for name, stats in report.items():
        # Summed-instead-of-averaged gradients would show up as ratio 2.0.
        assert abs(stats["ratio"] - 1.0) < RELATIVE_TOLERANCE * 10, (name, stats)
        assert stats["max_abs_diff"] <= RELATIVE_TOLERANCE * stats["max_abs_ref"] + 1e-8, (name, stats)
