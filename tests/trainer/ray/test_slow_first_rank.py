"""Rank 0's first download or tokenisation may outlast the process group's timeout; the other
ranks must wait for it without that timeout, and the process group must stay usable after."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

SLOW_SECONDS = 12
PG_TIMEOUT_SECONDS = 4


def _train_func(out: str) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from llmtrain_trainer.distributed import WorkerEnv, rank_zero_first

    context = ray.train.get_context()
    env = WorkerEnv(context.get_world_rank(), context.get_world_size(), 0, torch.device("cpu"))
    started = time.monotonic()
    with rank_zero_first(env):
        if env.is_main:
            time.sleep(SLOW_SECONDS)  # a first download or tokenisation
    waited = time.monotonic() - started
    total = torch.tensor([1.0])
    dist.all_reduce(total)  # the process group still works afterwards
    Path(out, f"rank-{env.rank}.json").write_text(json.dumps({"waited": waited, "world": total.item()}))


@pytest.mark.slow
def test_ranks_wait_for_rank_zero_beyond_the_collective_timeout(ray_address: str, tmp_path: Path) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        _train_func,
        train_loop_config=str(tmp_path),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo", timeout_s=PG_TIMEOUT_SECONDS),
        run_config=RunConfig(name="slow-first-rank", storage_path=str(tmp_path)),
    )
    result = trainer.fit()
    assert result.error is None
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world"] for r in ranks] == [2.0, 2.0]
    assert ranks[1]["waited"] >= SLOW_SECONDS - 1 > PG_TIMEOUT_SECONDS
