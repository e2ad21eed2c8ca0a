"""The step-progress watchdog (watchdog.py) with a fake clock and a recording sink: no Ray."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from llmtrain_trainer.watchdog import (
    WATCHDOG_DIR,
    Stall,
    StallReporter,
    StepWatchdog,
    stall_threshold_seconds,
)


class RecordingSink:
    def __init__(self) -> None:
        self.errors: list[str | None] = []
        self.closed = False

    def report_error(self, message: str | None) -> None:
        self.errors.append(message)

    def close(self, flush_timeout: float = 10.0) -> None:
        self.closed = True


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_threshold_is_well_under_the_process_group_timeout() -> None:
    assert stall_threshold_seconds(1800) == pytest.approx(600)
    assert stall_threshold_seconds(60) < 60


def test_a_stall_is_reported_once_with_rank_and_last_step_and_cleared_when_steps_resume(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, sink = FakeClock(), RecordingSink()
    watchdog = StepWatchdog(3, 300, StallReporter(lambda: sink), clock=clock)
    watchdog.beat(41)
    watchdog.beat(42)
    clock.now += 99
    assert watchdog.check() is None

    clock.now += 2
    stall = watchdog.check()
    assert stall == Stall(rank=3, last_step=42, seconds=101, timeout_seconds=300)
    clock.now += 500
    assert watchdog.check() is None, "one report per stall"

    watchdog.reporter.stalled(stall)
    assert sink.errors == [stall.message]
    assert stall.message.startswith("rank 3: no training step completed for 101s since step 42")
    assert "300s" in stall.message
    assert any("TRAINING STALLED" in r.message and r.levelname == "ERROR" for r in caplog.records)

    watchdog.beat(43)
    assert sink.errors == [stall.message, None], "the error is cleared once a step completes"
    clock.now += 101
    assert watchdog.check() == Stall(rank=3, last_step=43, seconds=101, timeout_seconds=300)


def test_no_sink_still_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Outside a cluster (no status to write) the stall and the recovery are still in the log."""
    opened: list[bool] = []
    reporter = StallReporter(lambda: opened.append(True))  # type: ignore[func-returns-value]
    with caplog.at_level(logging.WARNING, logger="llmtrain_trainer.watchdog"):
        reporter.stalled(Stall(0, 7, 700, 1800))
        reporter.stalled(Stall(0, 7, 760, 1800))
        reporter.recovered(Stall(0, 7, 760, 1800), 8)
        reporter.close()
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == [logging.ERROR, logging.ERROR, logging.WARNING]
    assert messages[0][1].startswith("TRAINING STALLED: rank 0: no training step completed")
    assert "since step 7" in messages[0][1]
    assert messages[2][1] == "rank 0: training continues (step 8) after a stall at step 7"
    assert opened == [True]  # the sink is asked for once, on the first stall


def test_the_thread_reports_a_stall_while_the_loop_is_blocked() -> None:
    sink = RecordingSink()
    watchdog = StepWatchdog(1, 0.6, StallReporter(lambda: sink), poll_seconds=0.02)
    watchdog.start(5)
    try:
        deadline = time.monotonic() + 5
        while not sink.errors and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watchdog.stop()
    assert sink.errors and sink.errors[0] is not None
    assert sink.errors[0].startswith("rank 1: no training step completed for 0s since step 5")
    assert sink.closed


def test_the_kubernetes_sink_clears_the_error_with_a_merge_patch_null() -> None:
    from llmtrain_trainer import kube_progress

    sent: list[dict[str, object]] = []

    class Recording(kube_progress.KubernetesProgressSink):
        def _patch(self, progress: dict[str, object]) -> bool:
            sent.append(progress)
            return True

    sink = Recording(kube_progress.ApiTarget("http://api.invalid", None, None), "team", "job", interval=0.01)
    sink.report_error("rank 1: no training step completed")
    sink.close(flush_timeout=5)
    sink = Recording(kube_progress.ApiTarget("http://api.invalid", None, None), "team", "job", interval=0.01)
    sink.report_error(None)
    sink.close(flush_timeout=5)
    assert sent[0]["error"] == "rank 1: no training step completed"
    assert "error" in sent[-1] and sent[-1]["error"] is None


def test_the_threshold_follows_the_timeout_in_effect() -> None:
    clock = FakeClock()
    watchdog = StepWatchdog(0, 1800, StallReporter(lambda: None), clock=clock)
    watchdog.beat(1)
    clock.now += 300
    assert watchdog.check() is None
    watchdog.set_timeout(600)  # network.stepTimeoutSeconds applied after the first step
    assert watchdog.check() == Stall(rank=0, last_step=1, seconds=300, timeout_seconds=600)


def test_a_checkpoint_however_long_is_not_a_stall() -> None:
    clock = FakeClock()
    watchdog = StepWatchdog(0, 300, StallReporter(lambda: None), clock=clock)
    watchdog.beat(40)
    with watchdog.paused():
        clock.now += 10 * 300  # a synchronous save of ~850 GB
        assert watchdog.check() is None
    clock.now += 99
    assert watchdog.check() is None, "the clock restarts after the pause"
    clock.now += 2
    stall = watchdog.check()
    assert stall is not None and stall.last_step == 40


def _ranks(board: Path, clock: FakeClock, world_size: int) -> list[StepWatchdog]:
    return [
        StepWatchdog(rank, 300, StallReporter(lambda: None), clock=clock, board=board, world_size=world_size)
        for rank in range(world_size)
    ]


def test_the_report_names_the_rank_the_others_wait_for(tmp_path: Path) -> None:
    """Rank 2 hangs loading step 8's data; ranks 0, 1 and 3 wait in step 8's collectives. All four
    stall; rank 0's report (the status) names rank 2, whatever rank 0 itself was doing."""
    clock, board = FakeClock(), tmp_path / WATCHDOG_DIR
    (board).mkdir()
    (board / "rank-5.json").write_text('{"rank": 5, "step": 1, "phase": "outside collectives"}')  # stale
    ranks = _ranks(board, clock, 4)
    for watchdog in ranks:
        watchdog.beat(7)
        if watchdog.rank != 2:
            watchdog.entering_collectives()
        watchdog.publish()
    clock.now += 101

    stall = ranks[0].check()
    assert stall is not None and stall.rank == 0
    assert "stuck: rank 2 (at step 7, outside collectives" in stall.message
    assert "rank 0 (" not in stall.message and "rank 5" not in stall.message


def test_a_rank_behind_the_others_is_named_and_a_network_hang_is_said_to_be_one(tmp_path: Path) -> None:
    clock, board = FakeClock(), tmp_path / WATCHDOG_DIR
    ranks = _ranks(board, clock, 2)
    ranks[0].beat(8)
    ranks[1].beat(7)
    for watchdog in ranks:
        watchdog.entering_collectives()
        watchdog.publish()
    clock.now += 101
    stall = ranks[0].check()
    assert stall is not None and "stuck: rank 1 (behind, at step 7" in stall.message

    ranks[1].beat(8)
    ranks[0].beat(8)
    for watchdog in ranks:
        watchdog.entering_collectives()
        watchdog.publish()
    clock.now += 101
    stall = ranks[0].check()
    assert stall is not None and "every rank waits inside the step's collectives" in stall.message


def test_only_rank_zero_writes_the_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank stalls in a hang: one writer, which names the stuck rank, not the last to patch."""
    import ray.train
    import torch
    from llmtrain_trainer import kube_progress
    from llmtrain_trainer.distributed import WorkerEnv
    from llmtrain_trainer.lifecycle import Lifecycle, LoopOptions
    from llmtrain_trainer.modes import builtin, mode_for

    from tests.support.trainer import tiny_config

    sinks: list[RecordingSink] = []
    monkeypatch.setattr(
        kube_progress, "kubernetes_sink", lambda config: sinks.append(RecordingSink()) or sinks[-1]
    )
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)  # a fresh run, outside Ray Train
    config = tiny_config(tmp_path, "watchdog", progress={"reportToKubernetes": True})
    for rank in (1, 0):
        env = WorkerEnv(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"))
        life = Lifecycle(config, env, tmp_path / "run", LoopOptions(log_lines=False), mode_for("builtin"))
        watchdog = builtin.TrainingRun(config, env, tmp_path / "run", life)._watchdog()
        assert watchdog.board == tmp_path / "run" / WATCHDOG_DIR and watchdog.world_size == 2
        watchdog.reporter.stalled(Stall(rank, 3, 700.0, 1800.0))
        assert len(sinks) == (0 if rank == 1 else 1), rank
    assert sinks[0].errors and sinks[0].errors[0] is not None and sinks[0].errors[0].startswith("rank 0:")
