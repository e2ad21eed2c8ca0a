"""`llmtrain run` shows text from elsewhere (errors, paths, names) literally, never as rich markup.

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
from rich.console import Console

from tests.trainer.helpers import REPO

GLOO_TIMEOUT = (
    "RuntimeError on rank 0: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "unbound_buffer.cc:129] Timed out waiting 60000ms for send operation to complete"
)
BRACKETED = "[/mnt/[red]runs]"


def write_job(folder: Path) -> Path:
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["spec"]["dataset"]["path"] = str(REPO / "examples" / "data" / "tiny-stories.txt")
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
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
