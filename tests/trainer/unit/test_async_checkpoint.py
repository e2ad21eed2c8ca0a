"""When a checkpoint counts (checkpoint.asyncSave): the built-in loop's and the lifecycle's ordering
with a strategy whose writes finish when the test says so, in a one-process gloo group, with Ray
Train's report recorded."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from llmtrain_trainer import checkpoint
from llmtrain_trainer.data import SequenceData
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.lifecycle import Lifecycle, LoopOptions
from llmtrain_trainer.modes import mode_for
from llmtrain_trainer.modes.builtin import TrainingRun
from llmtrain_trainer.run_context import RayRunContext
from llmtrain_trainer.rundir import STATE_FILE, checkpoint_name
from llmtrain_trainer.strategies.base import Strategy

from tests.support.trainer import tiny_config

ENV = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
NO_VALIDATION = cast(SequenceData, SimpleNamespace(validation=None))


class ControlledWrites:
    """Stands in for a Strategy: each save's write finishes when the test resolves its future."""

    def __init__(self) -> None:
        self.writes: list[Future[Any]] = []

    def start_save(self, directory: Path) -> Future[Any]:
        directory.mkdir(parents=True, exist_ok=True)
        self.writes.append(Future())
        return self.writes[-1]


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import ray.train

    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)  # a fresh run, outside Ray Train
    steps: list[int] = []
    monkeypatch.setattr(
        RayRunContext,
        "report_checkpoint",
        lambda self, directory, metrics, env: steps.append(metrics["step"]),
    )
    return steps


def _run(tmp_path: Path, async_save: bool) -> TrainingRun:
    config = tiny_config(tmp_path, "ordering", checkpoint={"asyncSave": async_save})
    lifecycle = Lifecycle(config, ENV, tmp_path / "run", LoopOptions(log_lines=False), mode_for("builtin"))
    return TrainingRun(config, ENV, tmp_path / "run", lifecycle)


def _checkpoint(run: TrainingRun, writes: ControlledWrites, step: int) -> None:
    state = checkpoint.TrainerState(step=step, world_size=1)
    with run.life.paused() as started:
        run._checkpoint(cast(Strategy, writes), state, NO_VALIDATION, None, evaluated=False, started=started)


@pytest.mark.usefixtures("one_process_group")
def test_an_async_checkpoint_counts_only_once_its_write_has_finished(
    tmp_path: Path, reported: list[int]
) -> None:
    run, writes = _run(tmp_path, async_save=True), ControlledWrites()
    first = run.run_dir / checkpoint_name(10)

    _checkpoint(run, writes, 10)  # returns while the shards are still being written
    assert not (first / STATE_FILE).exists() and reported == []

    waiting = threading.Thread(target=run.life.complete_pending)
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive(), "completing must wait for the write"
    assert not (first / STATE_FILE).exists() and reported == []
    writes.writes[0].set_result(None)
    waiting.join(timeout=10)
    assert not waiting.is_alive()
    assert (first / STATE_FILE).exists() and reported == [10]


@pytest.mark.usefixtures("one_process_group")
def test_the_next_checkpoint_waits_for_the_previous_and_a_failed_write_never_counts(
    tmp_path: Path, reported: list[int]
) -> None:
    run, writes = _run(tmp_path, async_save=True), ControlledWrites()
    _checkpoint(run, writes, 10)
    writes.writes[0].set_result(None)
    _checkpoint(run, writes, 20)
    assert reported == [10] and len(writes.writes) == 2  # 10 registered before 20 started
    writes.writes[1].set_exception(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        run.life.complete_pending()
    assert reported == [10]
    assert not (run.run_dir / checkpoint_name(20) / STATE_FILE).exists()


@pytest.mark.usefixtures("one_process_group")
def test_a_synchronous_checkpoint_counts_before_training_goes_on(tmp_path: Path, reported: list[int]) -> None:
    run = _run(tmp_path, async_save=False)
    assert run.config.checkpoint.async_save is False, "async saving is opt-in"

    class Written(ControlledWrites):
        def start_save(self, directory: Path) -> Future[Any]:
            done = super().start_save(directory)
            done.set_result(None)
            return done

    _checkpoint(run, Written(), 10)
    assert reported == [10] and run.life.pending is None
    assert (run.run_dir / checkpoint_name(10) / STATE_FILE).exists()
