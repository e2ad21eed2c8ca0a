"""FSDP2 gradient accumulation keeps only sharded gradients between micro-batches, and still gives
the gradients of one single-process step over all the micro-batches.

The bytes are counted in FSDP2's own per-parameter state (private API, read-only): the sharded
`.grad`, plus any unsharded gradient or fp32 accumulator it holds until the next sync. Without a
sync on a non-final micro-batch those unsharded buffers hold the whole model's gradients on each
rank; with a sync every micro-batch a rank holds 1/world of them.
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
from torch.distributed.tensor import DTensor

from tests.support.trainer import reference_gradients, run_on_workers, tiny_config

pytestmark = pytest.mark.slow

MICRO_BATCHES = 3


def gradient_bytes_held(strategy: FsdpStrategy) -> int:
    """Bytes of gradient this rank holds: sharded grads plus FSDP2's unsharded buffers."""
    held = 0
    for module in strategy.sharded:
        for group in module._get_fsdp_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                grad = fsdp_param.sharded_param.grad
                if grad is not None:
                    local = grad.to_local() if isinstance(grad, DTensor) else grad
                    held += local.numel() * local.element_size()
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                for buffer in (
                    unsharded.grad if unsharded is not None else None,
                    fsdp_param.unsharded_accumulated_grad,
                ):
                    if buffer is not None:
                        held += buffer.numel() * buffer.element_size()
    return held


def accumulate(loop_config: dict[str, Any]) -> None:
    """Per worker: one step of MICRO_BATCHES micro-batches, counting gradient bytes after each."""
    config = TrainerConfig.model_validate(loop_config["trainer_config"])
    env = WorkerEnv.from_ray_context()
    tokenizer = load_tokenizer(config.model)
    data = build_sequences(config.dataset, tokenizer, config.training.seed)
    strategy = FsdpStrategy(config, env, total_steps=10)
    initial = strategy.full_state_dict()
    full_bytes = sum(p.numel() * p.element_size() for p in strategy.model.parameters())  # global sizes

    def batches_of(rank: int) -> list[dict[str, torch.Tensor]]:
        source = DistributedBatches(
            data.train, config.training.micro_batch_size, rank, env.world_size, 0, tokenizer.pad_token_id
        )
        return [source.next_batch() for _ in range(MICRO_BATCHES)]

    every = [batches_of(rank) for rank in range(env.world_size)]
    step_tokens = sum(trained_tokens(b["labels"]) for mine in every for b in mine)
    held = []
    for i, batch in enumerate(every[env.rank]):
        strategy.forward_backward(
            batch, env.world_size / step_tokens, last_micro_batch=i == MICRO_BATCHES - 1
        )
        held.append(gradient_bytes_held(strategy))
    grads = {name: param.grad.full_tensor() for name, param in strategy.model.named_parameters()}

    report: dict[str, Any] = {"rank": env.rank, "full_bytes": full_bytes, "held": held}
    if env.is_main:
        assert initial is not None
        expected = reference_gradients(config, initial, [b for mine in every for b in mine], step_tokens)
        report["max_relative_diff"] = max(
            float((grad - expected[name]).abs().max() / expected[name].abs().max())
            for name, grad in grads.items()
        )
    Path(loop_config["report_dir"], f"rank{env.rank}.json").write_text(json.dumps(report))


def test_accumulation_keeps_gradients_sharded(ray_address: str, storage: Path) -> None:
    config = tiny_config(storage, "accumulate", training={"gradientAccumulationSteps": MICRO_BATCHES})
    run_on_workers(accumulate, config, report_dir=str(storage))
    reports = [json.loads((storage / f"rank{rank}.json").read_text()) for rank in range(2)]
    for report in reports:
        peak_fraction = max(report["held"]) / report["full_bytes"]
        print(
            f"rank {report['rank']}: gradient bytes held per micro-batch {report['held']}, "
            f"model {report['full_bytes']}, peak {peak_fraction:.2f} of a full copy"
        )
        # Sharded over 2 ranks: about half of the model's fp32 gradients (dim-0 shards may be uneven).
        assert peak_fraction < 0.6, report
    assert reports[0]["max_relative_diff"] < 1e-5, reports[0]
