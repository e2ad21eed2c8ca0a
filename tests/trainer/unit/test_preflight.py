"""Bad configs fail in the driver with one line naming the problem, before any Ray worker starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import llmtrain_trainer.main as trainer_main
import pytest

from tests.support.trainer import REPO, tiny_config, write_config


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reaching Ray at all would be a failure of these tests."""

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("training started for an invalid config")

    monkeypatch.setattr(trainer_main, "run_training", forbidden)
    monkeypatch.setattr("ray.init", forbidden)


def run_main(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = trainer_main.main(["--config", str(path)])
    return code, capsys.readouterr().err.strip()


def write(tmp_path: Path, document: dict[str, Any] | str) -> Path:
    path = tmp_path / "trainer-config.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def valid_document(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = tiny_config(tmp_path, "bad").model_dump(mode="json", by_alias=True)
    return data


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["scaling"].update(numWorkers=0),
            r"scaling\.numWorkers: Input should be greater than or equal to 1",
        ),
        (lambda d: d.pop("runName"), r"runName: Field required"),
        (
            lambda d: d["dataset"].update(path="/data/missing.jsonl"),
            r"dataset\.path '/data/missing\.jsonl' does not exist",
        ),
        (
            lambda d: d["model"]["config"].update(model_type="nonsense"),
            r"model\.config\.model_type 'nonsense' is not an architecture",
        ),
        (
            lambda d: d["model"].update(name="/models/absent", config=None, tokenizer=None),
            r"model\.name '/models/absent': cannot load its config",
        ),
        (
            lambda d: d["model"]["config"].update(vocab_size=200),
            r"raise model\.config\.vocab_size to at least 263",
        ),
        (
            lambda d: d.update(method={"type": "lora", "lora": {"targetModules": ["qkv_proj"]}}),
            r"method\.lora\.targetModules \['qkv_proj'\] name no module of llama",
        ),
        (lambda d: d["training"].update(precision="fp16"), r"training\.precision fp16 needs GPUs"),
        (
            lambda d: d.update(resumeFrom={"runsRoot": "/nonexistent/runs", "run": "old-job/uid-0"}),
            r"resumeFrom\.run 'old-job/uid-0': no run directory /nonexistent/runs/old-job/uid-0",
        ),
        (
            lambda d: d.update(
                resumeFrom={"runsRoot": "/r", "checkpoint": "/seeds/checkpoint-step-00000010"}
            ),
            r"resumeFrom\.checkpoint /seeds/checkpoint-step-00000010 does not exist",
        ),
    ],
    ids=[
        "range",
        "missing-field",
        "dataset-path",
        "model-type",
        "model-path",
        "vocab",
        "lora-targets",
        "fp16-cpu",
        "resume-from-run",
        "resume-from-checkpoint",
    ],
)
def test_bad_config_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, expected: str
) -> None:
    document = valid_document(tmp_path)
    change(document)
    code, err = run_main(write(tmp_path, document), capsys)
    assert code == 2
    assert err.startswith("llmtrain-trainer: error: ") and "\n" not in err
    assert re.search(expected, err), err


def test_unreadable_and_malformed_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(tmp_path / "absent.json", capsys)
    assert code == 2 and "cannot read trainer config" in err and "absent.json" in err
    code, err = run_main(write(tmp_path, "{not json"), capsys)
    assert code == 2 and "is not valid JSON" in err


@pytest.mark.thorough
def test_entrypoint_exits_2_without_starting_ray(tmp_path: Path) -> None:
    """The RayJob's exact command: a bad dataset path fails fast, in one line, with no Ray started."""
    config = tiny_config(tmp_path, "bad", dataset={"path": str(tmp_path / "no-such-data")})
    path = write_config(config, tmp_path / "trainer-config.json")
    process = subprocess.run(
        [sys.executable, "-m", "llmtrain_trainer.main", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert process.returncode == 2
    lines = process.stderr.strip().splitlines()
    assert lines == [f"llmtrain-trainer: error: dataset.path '{tmp_path / 'no-such-data'}' does not exist"]
    assert "Ray" not in process.stdout


@pytest.mark.parametrize(
    ("strategy", "warned"),
    [
        ({"type": "fsdp"}, "fp32 full state dict, about 4.0 GiB"),
        ({"type": "deepspeed"}, "16-bit consolidated state dict, about 2.0 GiB"),
        ({"type": "deepspeed", "deepspeed": {"zeroStage": 2}}, None),
        ({"type": "ddp"}, None),
    ],
)
def test_a_huggingface_export_that_gathers_the_model_on_rank_zero_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, strategy: dict[str, Any], warned: str | None
) -> None:
    from llmtrain_trainer import preflight

    config = tiny_config(
        tmp_path, "hf", trainer={"type": "huggingface"}, strategy=strategy, checkpoint={"export": True}
    )
    preflight._check_export(config, 2**30)
    found = [r.message for r in caplog.records if "gathers the whole model on rank 0" in r.message]
    if warned is None:
        assert found == []
    else:
        assert len(found) == 1 and warned in found[0] and "trainer.type builtin streams" in found[0]
    builtin = tiny_config(tmp_path, "builtin", strategy=strategy, checkpoint={"export": True})
    caplog.clear()
    preflight._check_export(builtin, 2**30)
    assert not caplog.records
