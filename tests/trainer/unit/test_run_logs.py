"""The trainer's saved logs (run_logs.py): records reach `<run_dir>/logs/*.log` as they are logged,
group-readable whatever the umask, appended across attempts; the driver and the worker entry point
write theirs, errors with their traceback."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llmtrain_trainer.loop as loop
import llmtrain_trainer.main as trainer_main
import pytest
import torch
from llmtrain_trainer import modes, run_context, run_logs
from llmtrain_trainer.distributed import WorkerEnv

from tests.support.trainer import tiny_config, write_config

LOG = logging.getLogger("llmtrain_trainer.progress")


@pytest.fixture(autouse=True)
def info_level() -> Iterator[None]:
    """The trainer's logger at INFO, as the entry points set it; restored after the test."""
    logger = logging.getLogger("llmtrain_trainer")
    before = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(before)


def test_each_record_is_in_the_file_before_the_handler_is_closed(tmp_path: Path) -> None:
    handler = run_logs.attach_worker(tmp_path, 3)
    try:
        LOG.info("step 7/10 loss 2.5")
        LOG.warning("a checkpoint was skipped")
        # Read while the handler is still open: a pod killed now leaves these lines.
        text = (tmp_path / "logs" / "worker-3.log").read_text()
    finally:
        run_logs.detach(handler)
    assert "INFO llmtrain_trainer.progress: step 7/10 loss 2.5" in text
    assert "WARNING llmtrain_trainer.progress: a checkpoint was skipped" in text
    assert handler not in logging.getLogger().handlers


def test_files_are_readable_by_the_group_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        run_logs.detach(run_logs.attach_driver(tmp_path / "run"))
    finally:
        os.umask(previous)
    logs = tmp_path / "run" / "logs"
    assert stat.S_IMODE(logs.stat().st_mode) == 0o755
    assert stat.S_IMODE((logs / "driver.log").stat().st_mode) == 0o644


def test_a_second_attempt_appends_after_a_separator(tmp_path: Path) -> None:
    for attempt in ("first", "second"):
        handler = run_logs.attach_worker(tmp_path, 0)
        LOG.info("%s attempt's step", attempt)
        run_logs.detach(handler)
    lines = (tmp_path / "logs" / "worker-0.log").read_text().splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("===== worker rank 0 attempt started")]
    first = next(i for i, line in enumerate(lines) if "first attempt's step" in line)
    second = next(i for i, line in enumerate(lines) if "second attempt's step" in line)
    assert len(headers) == 2 and headers[0] < first < headers[1] < second, lines
    assert f"(pid {os.getpid()})" in lines[headers[1]]


def test_the_driver_saves_its_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A preflight refusal: printed once on stderr and kept in driver.log."""
    config = tiny_config(tmp_path, "bad", dataset={"path": str(tmp_path / "no-such-data")})
    path = write_config(config, tmp_path / "trainer-config.json")
    assert trainer_main.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("does not exist") == 1, err
    text = (Path(config.run_dir) / "logs" / "driver.log").read_text()
    assert text.startswith("===== driver attempt started")
    assert "ERROR llmtrain_trainer: llmtrain-trainer: error: dataset.path" in text, text


def test_a_worker_saves_the_traceback_of_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray Train entry point on rank 1: whatever the mode raises is in worker-1.log with its
    traceback, and still raised (Ray Train must see the failure)."""
    config = tiny_config(tmp_path, "fails")
    run_dir = tmp_path / "run"
    # The worker-only modules loop.py imports inside its functions (the driver never loads them).
    monkeypatch.setattr(run_context.RayRunContext, "run_dir", staticmethod(lambda: run_dir))
    monkeypatch.setattr(WorkerEnv, "from_ray_context", lambda: WorkerEnv(1, 2, 0, torch.device("cpu")))

    def broken_mode(_: Any) -> Any:
        raise RuntimeError("the mode could not start")

    monkeypatch.setattr(modes, "mode_for", broken_mode)
    with pytest.raises(RuntimeError, match="could not start"):
        loop.train_loop_per_worker(loop.loop_config(config))
    text = (run_dir / "logs" / "worker-1.log").read_text()
    assert "training failed on rank 1" in text and "Traceback (most recent call last)" in text, text
    assert "RuntimeError: the mode could not start" in text
    assert not any(isinstance(h, run_logs.RunLogHandler) for h in logging.getLogger().handlers)
