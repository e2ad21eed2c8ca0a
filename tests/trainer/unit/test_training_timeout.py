"""network.stepTimeoutSeconds: a shorter process-group timeout once training runs, applied to a
live gloo group (one process), while start-up keeps collectiveTimeoutSeconds."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from llmtrain_trainer.distributed import apply_training_timeout, training_timeout_seconds

from tests.support.trainer import tiny_config

START_UP = 1800


@pytest.fixture
def gloo_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp_path / 'rendezvous'}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=START_UP),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _group_timeout() -> timedelta:
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    timeout: timedelta = backend.options._timeout  # type: ignore[attr-defined]
    return timeout


@pytest.mark.usefixtures("gloo_group")
@pytest.mark.parametrize(
    ("step_timeout", "expected"),
    [(300, 300), (None, START_UP), (START_UP * 2, START_UP)],
    ids=["shorter", "unset", "longer-never-lengthens"],
)
def test_the_group_takes_the_step_timeout_once_training_runs(
    tmp_path: Path, step_timeout: int | None, expected: int
) -> None:
    network = {} if step_timeout is None else {"stepTimeoutSeconds": step_timeout}
    config = tiny_config(tmp_path, "timeouts", collectiveTimeoutSeconds=START_UP, network=network)
    assert training_timeout_seconds(config) == expected
    assert _group_timeout() == timedelta(seconds=START_UP)
    assert apply_training_timeout(config) is (expected < START_UP)
    assert _group_timeout() == timedelta(seconds=expected)


MESH_START_UP = 900  # neither gloo's default (30 min) nor NCCL's (10 min)
SLOW_FIRST_STEP = 2.0


def _timeout_of(group: dist.ProcessGroup) -> float:
    timeout: timedelta = group._get_backend(torch.device("cpu")).options._timeout  # type: ignore[attr-defined]
    return timeout.total_seconds()


def _hsdp_rank(rank: int, tmp_path: Path) -> None:
    """One of two gloo processes: an HSDP mesh (2 replicas of 1 shard), then the step timeout."""
    import json
    import time

    from llmtrain.api.spec import FsdpSpec
    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.strategies.fsdp import device_mesh

    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp_path / 'rendezvous'}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=MESH_START_UP),
    )
    try:
        env = WorkerEnv(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"))
        mesh = device_mesh(env, FsdpSpec(hybrid_shard_size=1), MESH_START_UP)
        groups = mesh.get_all_groups()
        start_up = [_timeout_of(group) for group in groups]
        config = tiny_config(
            tmp_path, "hsdp", collectiveTimeoutSeconds=MESH_START_UP, network={"stepTimeoutSeconds": 300}
        )
        if rank == 1:
            time.sleep(SLOW_FIRST_STEP)  # still compiling its first step
        began = time.monotonic()
        assert apply_training_timeout(config, groups)
        waited = time.monotonic() - began
        training = [_timeout_of(group) for group in groups]
        (tmp_path / f"rank-{rank}.json").write_text(
            json.dumps({"start_up": start_up, "training": training, "waited": waited})
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks train
def test_hsdp_mesh_groups_take_the_timeouts_after_every_rank_is_past_the_first_step(tmp_path: Path) -> None:
    """The mesh's groups are created with the backend's default timeout (NCCL's 10 minutes); they
    take collectiveTimeoutSeconds at start-up and stepTimeoutSeconds once training runs, and no
    rank lowers its timeout while another is still in its first step."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(_hsdp_rank, args=(tmp_path,), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    for rank in ranks:
        assert rank["start_up"] == [MESH_START_UP, MESH_START_UP]
        assert rank["training"] == [300, 300]
    assert ranks[0]["waited"] >= SLOW_FIRST_STEP * 0.75, "rank 0 lowered its timeout before rank 1 was ready"
