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
