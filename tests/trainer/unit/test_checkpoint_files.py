"""Checkpoint files on disk without Ray Train: durable writes, and which checkpoint `restore` picks
when the latest one is unusable (one process in a gloo group, a strategy that only records loads)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch
from llmtrain_trainer import checkpoint
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.rundir import (
    STATE_FILE,
    checkpoint_name,
    checkpoint_order,
    complete_checkpoints,
    write_durably,
)

ENV = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_a_durable_write_is_synced_and_a_failed_one_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    target = tmp_path / "state.json"
    write_durably(target, lambda file: file.write(b"old"))
    assert target.read_bytes() == b"old" and len(synced) >= 1

    def torn(file: BinaryIO) -> None:
        file.write(b"ne")
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write_durably(target, torn)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith("state.json")] == ["state.json"]


def _checkpoint(run_dir: Path, step: int, world_size: int = 1, copy: int = 0) -> Path:
    directory = run_dir / checkpoint_name(step, copy)
    (directory / checkpoint.RNG_DIR).mkdir(parents=True)
    torch.save(checkpoint._rng_state(), directory / checkpoint.RNG_DIR / "rank-0.pt")
    state = checkpoint.TrainerState(step=step, world_size=world_size)
    (directory / STATE_FILE).write_text(json.dumps(state.to_dict()))
    return directory


def test_complete_checkpoints_are_listed_newest_first(tmp_path: Path) -> None:
    old, new = _checkpoint(tmp_path, 10), _checkpoint(tmp_path, 20)
    (tmp_path / checkpoint_name(30)).mkdir()  # no state file: a save that never finished
    assert complete_checkpoints(tmp_path) == [new, old]


def test_a_first_save_sorts_before_its_copies_and_a_stray_name_before_every_step(tmp_path: Path) -> None:
    """A step's first save is copy 0, older than its `-1`; a directory with the prefix but no step
    number (a user's `checkpoint-step-backup`) never counts as the newest, not even over step 0."""
    # The names outlive a version (resumes read older runs' directories): a first save has no `-0`.
    assert checkpoint_name(30) == "checkpoint-step-00000030"
    assert checkpoint_name(30, 1) == "checkpoint-step-00000030-1"
    assert checkpoint_order(tmp_path / checkpoint_name(30)) == (30, 0)
    assert checkpoint_order(tmp_path / checkpoint_name(30, 1)) == (30, 1)
    stray = tmp_path / "checkpoint-step-backup"
    assert checkpoint_order(stray) < checkpoint_order(tmp_path / checkpoint_name(0))
    stray.mkdir()
    (stray / STATE_FILE).write_text("{}")
    first, again, zero = (
        _checkpoint(tmp_path, 30),
        _checkpoint(tmp_path, 30, copy=1),
        _checkpoint(tmp_path, 0),
    )
    assert complete_checkpoints(tmp_path) == [again, first, zero, stray]


class RecordingStrategy:
    """Stands in for a Strategy: fails to load the directories named in `broken`."""

    name = "recording"

    def __init__(self, broken: set[str], reshardable: bool = True) -> None:
        self.broken = broken
        self.reshardable_checkpoints = reshardable
        self.loaded: list[str] = []

    def load(self, directory: Path, weights_only: bool = False) -> None:
        self.loaded.append(directory.name)
        if directory.name in self.broken:
            raise RuntimeError("PytorchStreamReader failed reading zip archive\nmore detail")


_LATEST: dict[str, Path] = {}
"""The run context's latest checkpoint (what Ray Train, or the run directory, names)."""


def _latest_is(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    monkeypatch.setitem(_LATEST, "path", directory)


def _restore(strategy: Any, run_dir: Path) -> checkpoint.Restored | None:
    return checkpoint.restore(strategy, ENV, run_dir, _LATEST.get("path"))


@pytest.mark.usefixtures("one_process_group")
def test_restore_skips_a_corrupt_or_incomplete_latest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    _checkpoint(run_dir, 10)
    _checkpoint(run_dir, 20)
    corrupt = _checkpoint(run_dir, 30)
    (_checkpoint(run_dir, 40) / STATE_FILE).unlink()  # incomplete: Ray still names it the latest
    _checkpoint(run_dir, 50)  # newer than the latest reported one: never registered, never used
    _latest_is(monkeypatch, run_dir / checkpoint_name(40))
    strategy = RecordingStrategy(broken={corrupt.name})

    restored = _restore(strategy, run_dir)

    assert restored is not None and restored.state.step == 20
    assert strategy.loaded == [checkpoint_name(30), checkpoint_name(20)]
    assert restored.skipped[0].startswith(f"{checkpoint_name(40)} (rank 0: CheckpointError")
    assert (
        restored.skipped[1]
        == f"{checkpoint_name(30)} (rank 0: RuntimeError: PytorchStreamReader failed reading zip archive)"
    )


@pytest.mark.usefixtures("one_process_group")
def test_restore_fails_naming_every_checkpoint_when_none_is_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    first, second = _checkpoint(run_dir, 10), _checkpoint(run_dir, 20)
    (first / checkpoint.RNG_DIR / "rank-0.pt").unlink()
    _latest_is(monkeypatch, second)
    with pytest.raises(checkpoint.CheckpointError) as failure:
        _restore(RecordingStrategy(broken={second.name}), run_dir)
    message = str(failure.value)
    assert f"{second.name} (rank 0: RuntimeError" in message
    assert f"{first.name} (rank 0: CheckpointError" in message and "rng/rank-0.pt" in message
    assert "delete the run directory" in message


@pytest.mark.usefixtures("one_process_group")
def test_a_checkpoint_from_another_worker_count_is_refused_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSpeed cannot reshard: going back to an older checkpoint would not help (they were all
    written by the same workers) and would silently discard training."""
    run_dir = tmp_path / "run"
    _checkpoint(run_dir, 10, world_size=2)
    latest = _checkpoint(run_dir, 20, world_size=2)
    _latest_is(monkeypatch, latest)
    from llmtrain_trainer.strategies.deepspeed import DeepSpeedStrategy

    strategy = RecordingStrategy(broken=set(), reshardable=DeepSpeedStrategy.reshardable_checkpoints)
    with pytest.raises(
        checkpoint.IncompatibleCheckpoint, match=r"written by 2 workers .* resume with 2 workers"
    ):
        _restore(strategy, run_dir)
    assert strategy.loaded == []


def test_a_directory_that_refuses_fsync_still_gets_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some network filesystems refuse to fsync a directory: the rename stands without it."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(22, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "state.json"
    write_durably(target, lambda file: file.write(b"new"))
    assert target.read_bytes() == b"new"


@pytest.mark.usefixtures("one_process_group")
def test_saving_a_step_again_never_reuses_its_directory(tmp_path: Path) -> None:
    """After a fallback past a corrupt checkpoint-step-30 (still registered with Ray Train), step 30
    is saved again: into a new directory, leaving the registered one for Ray to retire."""
    run_dir = tmp_path / "run"
    registered = _checkpoint(run_dir, 30)
    again = checkpoint.prepare(run_dir, 30, ENV)
    assert again == run_dir / checkpoint_name(30, 1) and not any(again.iterdir())
    assert (registered / STATE_FILE).exists()
    assert checkpoint.prepare(run_dir, 30, ENV) == run_dir / checkpoint_name(30, 2)
    assert checkpoint.prepare(run_dir, 40, ENV) == run_dir / checkpoint_name(40)


@pytest.mark.usefixtures("one_process_group")
def test_a_later_save_of_a_step_is_the_newer_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    for copy in (0, 9, 10):
        _checkpoint(run_dir, 30, copy=copy)
    older = _checkpoint(run_dir, 20)
    names = [p.name for p in complete_checkpoints(run_dir)]
    assert names == [checkpoint_name(30, 10), checkpoint_name(30, 9), checkpoint_name(30), older.name]
    _latest_is(monkeypatch, run_dir / checkpoint_name(30, 10))
    strategy = RecordingStrategy(broken={checkpoint_name(30, 10)})
    restored = _restore(strategy, run_dir)
    assert restored is not None and strategy.loaded == [checkpoint_name(30, 10), checkpoint_name(30, 9)]
