"""The run lifecycle every mode shares (lifecycle.py) and the mode registry (modes/), without Ray:
records, the one checkpoint state format, the one result, the fields a mode refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer import checkpoint
from llmtrain_trainer.checkpoint import TrainerState
from llmtrain_trainer.distributed import WorkerEnv
from llmtrain_trainer.lifecycle import Lifecycle, LoopOptions
from llmtrain_trainer.modes import MODES, ModeError, mode_for, refuse_unsupported
from llmtrain_trainer.preflight import _check_trainer
from llmtrain_trainer.progress import read_records
from llmtrain_trainer.run_context import RayRunContext
from llmtrain_trainer.rundir import METRICS_FILE, RESULT_FILE, STATE_FILE, RunResult, checkpoint_name

from tests.support.trainer import tiny_config

ENV = WorkerEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
CUSTOM: dict[str, Any] = {"trainer": {"type": "custom", "custom": {"function": "m:f"}}}


@pytest.fixture
def fresh_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's first attempt outside Ray Train, whose reports are dropped."""
    import ray.train

    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    monkeypatch.setattr(RayRunContext, "report_checkpoint", lambda self, directory, metrics, env: None)


def lifecycle(config: TrainerConfig) -> Lifecycle:
    return Lifecycle(
        config, ENV, Path(config.run_dir), LoopOptions(log_lines=False), mode_for(config.trainer.type)
    )


def test_every_trainer_type_has_a_mode_named_after_it() -> None:
    for trainer_type in MODES:
        assert mode_for(trainer_type).name == trainer_type
    with pytest.raises(ModeError, match=r"trainer\.type 'other'"):
        mode_for("other")


def test_the_huggingface_mode_refuses_hybrid_sharding_naming_the_field(tmp_path: Path) -> None:
    """A field the Trainer cannot honour fails preflight instead of being ignored."""
    hsdp = {"type": "fsdp", "fsdp": {"hybridShardSize": 2}}
    hf = tiny_config(tmp_path, "x", trainer={"type": "huggingface"}, strategy=hsdp, scaling={"useGpu": True})
    with pytest.raises(ModeError, match=r"strategy\.fsdp\.hybridShardSize is not supported with trainer"):
        _check_trainer(hf)
    refuse_unsupported(mode_for("builtin"), tiny_config(tmp_path, "x", strategy=hsdp))  # the loop shards so
    unset = tiny_config(tmp_path, "x", trainer={"type": "huggingface"}, strategy={"type": "ddp"})
    refuse_unsupported(mode_for("huggingface"), unset)


@pytest.mark.usefixtures("fresh_run", "one_process_group")
def test_every_mode_writes_one_state_format_and_one_result(tmp_path: Path) -> None:
    """A custom run's checkpoint carries the built-in loop's TrainerState (with its trainer and no
    shape), and its result.json reads back as the one RunResult."""
    config = tiny_config(tmp_path, "custom", **CUSTOM)
    with lifecycle(config) as run:
        run.announce("custom trainer m:f", resumed_at=None)
        run.step(10, 2.0, tokens_seen=1000)
        with run.checkpoint_dir(10) as directory:
            (directory / "state.pt").write_bytes(b"user state")
        run.finish()
    state = TrainerState.read(Path(config.run_dir) / checkpoint_name(10))
    assert state is not None and (state.step, state.trainer, state.shape) == (10, "custom", {})
    result = RunResult.read(Path(config.run_dir))
    assert result is not None and (result.trainer, result.steps, result.resumed_from_step) == (
        "custom",
        10,
        None,
    )
    assert result.checkpoint is not None and result.checkpoint.endswith(checkpoint_name(10))
    events = [r.event for r in read_records(Path(config.run_dir) / METRICS_FILE)]
    assert events == ["started", "step", "checkpoint", "finished"]


@pytest.mark.usefixtures("fresh_run")
def test_the_builtin_state_file_names_its_trainer_and_shape(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "builtin")
    state = lifecycle(config).stamp(TrainerState(step=3))
    assert (state.trainer, state.shape["strategy"]) == ("builtin", "fsdp")
    # An old built-in state file (no trainer) still reads as the built-in loop's.
    old = {"step": 3, "data": {"epoch": 0, "offset": 8}, "shape": {}}
    assert TrainerState.from_dict(old).trainer == "builtin"


@pytest.mark.usefixtures("fresh_run")
def test_tokens_per_second_and_eta_are_measured_over_training_time_only(tmp_path: Path) -> None:
    """Between two records: tokens/s from tokens_seen, the ETA from the time per step plus the
    checkpoints still to come at the last one's cost; a pause (a checkpoint) counts in neither."""
    config = tiny_config(tmp_path, "pace", training={"maxSteps": 100}, checkpoint={"everySteps": 50})
    run = lifecycle(config)
    run.announce("x", resumed_at=None, tokens_seen=0)
    emitted: list[Any] = []
    run.emit = emitted.append  # type: ignore[method-assign]
    run.throughput._seconds, run.throughput._started = 2.0, None  # 2 s of stepping, measured
    run.checkpoint_seconds = 30.0
    run.step(10, 1.0, tokens_seen=4000)
    record = emitted[-1]
    assert record.tokens_per_second == pytest.approx(2000.0)
    assert record.eta_seconds == pytest.approx(90 * 0.2 + 2 * 30.0)  # checkpoints at 50 and 100
    with run.paused():
        pass  # a pause adds no training time
    run.throughput._seconds, run.throughput._started = 1.0, None
    run.step(20, 0.9, tokens_seen=5000)
    assert emitted[-1].tokens_per_second == pytest.approx(1000.0)


def test_a_state_file_is_written_only_by_checkpoint_complete(tmp_path: Path) -> None:
    """The one writer: `complete` writes the state file; `written` carries it for the modes."""
    directory = tmp_path / checkpoint_name(5)
    directory.mkdir()
    pending = checkpoint.written(directory, 5, TrainerState(step=5, trainer="huggingface"))
    assert not (directory / STATE_FILE).exists()
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        checkpoint.complete(pending, ENV)
    finally:
        dist.destroy_process_group()
    state = TrainerState.read(directory)
    assert state is not None and state.trainer == "huggingface"


def test_a_torchrun_process_finds_its_place_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert WorkerEnv.from_torchrun(use_gpu=False) == WorkerEnv(3, 4, 1, torch.device("cpu"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    assert WorkerEnv.from_torchrun(use_gpu=False) == ENV


def test_a_result_reads_back_as_written_with_its_skipped_checkpoints(tmp_path: Path) -> None:
    result = RunResult(steps=40, skipped_checkpoints=("checkpoint-step-00000040 (rank 0: torn)",))
    result.write(tmp_path)
    text = (tmp_path / RESULT_FILE).read_text()
    # Indented for people who `cat` it; JSON has no tuples, so the list is written.
    assert text == json.dumps(result.to_dict(), indent=2) + "\n"
    assert json.loads(text)["skipped_checkpoints"] == ["checkpoint-step-00000040 (rank 0: torn)"]
    # The dict itself is JSON's shape: one key per field, lists for tuples.
    as_dict = result.to_dict()
    assert set(as_dict) == set(RunResult.__dataclass_fields__)
    assert as_dict["skipped_checkpoints"] == ["checkpoint-step-00000040 (rank 0: torn)"]
    assert RunResult.read(tmp_path) == result


def test_an_older_result_without_skipped_checkpoints_reads_as_none_skipped(tmp_path: Path) -> None:
    written = RunResult(steps=3).to_dict()
    del written["skipped_checkpoints"]
    written["from_a_newer_version"] = True
    (tmp_path / RESULT_FILE).write_text(json.dumps(written))
    result = RunResult.read(tmp_path)
    assert result is not None and result.skipped_checkpoints == () and result.steps == 3
