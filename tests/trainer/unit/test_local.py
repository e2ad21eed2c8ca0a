"""`llmtrain run` (local.py): it refuses an invalid job, keys a run on its job file, says when a run
has finished, and shows text from elsewhere (errors, paths, names) literally, never as rich markup.

Gloo and NCCL errors start with a source location in square brackets, e.g. `[/pytorch/third_party/
gloo/.../unbound_buffer.cc:129] Timed out ...`; read as markup that is a closing tag matching no
open tag, so printing it raised `MarkupError` and the user never learnt why training failed.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmtrain_trainer import local
from llmtrain_trainer.metrics import MetricsRecord
from llmtrain_trainer.progress_bar import ConsoleProgress
from llmtrain_trainer.rundir import METRICS_FILE, RESULT_FILE
from rich.console import Console

from tests.support.trainer import REPO

GLOO_TIMEOUT = (
    "RuntimeError on rank 0: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "unbound_buffer.cc:129] Timed out waiting 60000ms for send operation to complete"
)
BRACKETED = "[/mnt/[red]runs]"


def write_job(folder: Path, **spec_changes: Any) -> Path:
    """examples/tiny-cpu.yaml as `folder/job.yaml`, with `spec_changes` applied."""
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["spec"]["dataset"]["path"] = str(REPO / "examples" / "data" / "tiny-stories.txt")
    job["spec"].update(spec_changes)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything up to the training itself runs; Ray is never started."""
    monkeypatch.setattr("ray.init", lambda *args, **kwargs: None)
    monkeypatch.setattr("ray.shutdown", lambda *args, **kwargs: None)
    monkeypatch.setattr("llmtrain_trainer.preflight.check", lambda config: None)


def test_a_training_failure_with_square_brackets_is_shown_as_is(
    tmp_path: Path, no_ray: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmtrain_trainer.main import TrainingError

    def fail(*args: Any, **kwargs: Any) -> None:
        raise TrainingError(GLOO_TIMEOUT)

    monkeypatch.setattr("llmtrain_trainer.main.run_training", fail)
    assert local.run_local(write_job(tmp_path), tmp_path / "runs") == 1
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert f"training failed: {GLOO_TIMEOUT}" in out


def test_a_failed_local_run_saves_it_in_the_run_directorys_driver_log(
    tmp_path: Path, no_ray: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`llmtrain run` leaves the cluster's log files in the local run directory and points there."""
    from llmtrain_trainer.main import TrainingError

    def fail(*args: Any, **kwargs: Any) -> None:
        raise TrainingError("RuntimeError on rank 1: boom")

    monkeypatch.setattr("llmtrain_trainer.main.run_training", fail)
    assert local.run_local(write_job(tmp_path), tmp_path / "runs") == 1
    out = " ".join(capsys.readouterr().out.split())
    (driver,) = (tmp_path / "runs").glob("*/*/logs/driver.log")
    assert f"WorkerLogs:{driver.parent}(worker-<rank>.log)".lower() in out.replace(" ", "").lower(), out
    text = driver.read_text()
    assert (
        "INFO llmtrain_trainer: training " in text and "training failed: RuntimeError on rank 1: boom" in text
    )


def test_a_preflight_error_with_square_brackets_is_shown_as_is(
    tmp_path: Path, no_ray: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmtrain_trainer.preflight import PreflightError

    def refuse(config: object) -> None:
        raise PreflightError(f"dataset.path {BRACKETED} does not exist")

    monkeypatch.setattr("llmtrain_trainer.preflight.check", refuse)
    assert local.run_local(write_job(tmp_path), tmp_path / "runs") == 2
    assert f"dataset.path {BRACKETED} does not exist" in capsys.readouterr().out


def test_paths_with_square_brackets_are_shown_as_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wide enough that rich does not fold the path itself: tmp_path is longer under pytest-xdist
    # (a popen-gwN folder) and in a deep TMPDIR, and a fold inside a word cannot be joined back.
    monkeypatch.setenv("COLUMNS", "1000")
    folder = tmp_path / "[bold]jobs"
    job = write_job(folder)
    job.write_text("spec: [unclosed")
    assert local.run_local(job, tmp_path / "runs") == 2
    assert str(folder) in " ".join(capsys.readouterr().out.split())


def test_the_summary_and_the_progress_lines_show_paths_as_is(tmp_path: Path) -> None:
    out = io.StringIO()
    local.print_summary(
        Console(file=out, width=400),
        {"run_dir": f"/runs/{BRACKETED}", "checkpoint": f"{BRACKETED}/checkpoint-step-00000010"},
    )
    assert f"{BRACKETED}/checkpoint-step-00000010" in out.getvalue()

    metrics = tmp_path / "metrics.jsonl"
    progress = ConsoleProgress(metrics)  # follows what is appended from now on
    progress.console = Console(file=(shown := io.StringIO()), width=400)
    records = [
        MetricsRecord("checkpoint", 10, 20, path=BRACKETED),
        MetricsRecord("exported", 20, 20, path=BRACKETED),
    ]
    metrics.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    with progress:
        pass
    assert shown.getvalue().count(BRACKETED) == 2


# ----------------------------------------------------------------------------- llmtrain run


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started")

    monkeypatch.setattr("ray.init", forbidden)


def test_run_local_rejects_an_invalid_job(
    tmp_path: Path, no_training: None, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_job(tmp_path, strategy={"type": "fsdp", "deepspeed": {"zeroStage": 3}})
    assert local.run_local(job, tmp_path / "runs") == 2
    assert "strategy.deepspeed" in capsys.readouterr().out


def test_a_local_run_is_keyed_on_the_job_file(tmp_path: Path) -> None:
    """The same file resumes its run; another file with the same job name starts its own."""
    job = write_job(tmp_path)
    other = job.with_name("other.yaml")
    other.write_text(job.read_text())
    runs = tmp_path / "runs"
    first = Path(local.load_job_config(job, runs, use_gpu=False).run_dir)
    assert first == Path(local.load_job_config(job, runs, use_gpu=False).run_dir) == runs / "tiny-cpu" / "job"
    assert Path(local.load_job_config(other, runs, use_gpu=False).run_dir) == runs / "tiny-cpu" / "other"


def test_run_local_says_a_finished_run_is_finished(
    tmp_path: Path, no_training: None, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "runs" / "tiny-cpu" / "job"  # <job name>/<job file stem>
    run_dir.mkdir(parents=True)
    records = [
        MetricsRecord("step", 1, 120, loss=6.0),
        MetricsRecord("step", 50, 120, loss=9.9),  # from an attempt that died after its checkpoint at 40
        MetricsRecord("resumed", 40, 120),
        MetricsRecord("step", 50, 120, loss=3.0),
        MetricsRecord("step", 120, 120, loss=2.5),
    ]
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    (run_dir / RESULT_FILE).write_text(json.dumps({"finished": True, "steps": 120, "resumed_from_step": 40}))
    assert local.run_local(write_job(tmp_path), tmp_path / "runs") == 0
    out = capsys.readouterr().out
    assert "already finished" in out and "--fresh" in out
    summary = local.build_summary(run_dir, None)
    assert (summary["initial_loss"], summary["final_loss"], summary["resumed_from_step"]) == (6.0, 2.5, 40)
    local.plot_loss_curve(run_dir, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000


# torchrun's report (torch 2.13) when a rank was killed by a signal: no line of it says "error:".
TORCHRUN_KILLED = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=====================================================
llmtrain_trainer.launch FAILED
-----------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
-----------------------------------------------------
Root Cause (first observed failure):
[1]:
  time      : 2026-11-27_03:47:10
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 8048)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 8048
=====================================================
"""


def test_a_failed_launch_names_launchs_message_else_the_signal_that_killed_a_rank() -> None:
    """`llmtrain run --no-ray` said only "training failed: exit code 1" when a rank died by a
    signal (torchrun then exits 1 and no line says "error:"): it now names the signal."""
    killed = ["step 3/4 | loss 5.2", *TORCHRUN_KILLED.splitlines()]
    assert local.launch_failure(killed, 1) == "exitcode  : -9 (pid: 8048)  (SIGKILL)"
    message = "python -m llmtrain_trainer.launch: error: training failed: RuntimeError: boom"
    assert local.launch_failure([message, *TORCHRUN_KILLED.splitlines()], 1) == message
    traceback = ["Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: bad"]
    assert local.launch_failure(traceback, 1) == "ValueError: bad"
    assert local.launch_failure(["step 1/4"], 1) == "exit code 1"
