"""The offline CLI: render, validate and crd, as a user runs them (subprocess for the entry point),
and how `llmtrain run` finds the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path

import pytest
import yaml
from llmtrain import cli
from llmtrain.api.crd import crd_yaml
from llmtrain.cli import main

from tests.support.jobs import REPO_ROOT, minimal_job

LLMTRAIN = [sys.executable, "-m", "llmtrain.cli"]


def test_render_example_as_yaml_through_the_console_script() -> None:
    out = subprocess.run(
        [*LLMTRAIN, "render", "examples/llama3-8b-fsdp.yaml"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert kinds == ["ServiceAccount", "PersistentVolumeClaim", "ConfigMap", "RayJob"]
    # Plain YAML a reviewer can read: the labels and tolerations the pod templates share are written
    # out in full, not as anchors and aliases.
    assert "&id" not in out and "*id" not in out


def test_render_json_list_and_trainer_image(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["render", str(REPO_ROOT / "examples/tiny-cpu.yaml"), "-o", "json", "--trainer-image", "r/t:9"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "List"
    rayjob = doc["items"][-1]
    assert (
        rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
        == "r/t:9"
    )


def test_render_invalid_file_fails_without_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(minimal_job(strategy={"type": "fsdp", "deepspeed": {"zeroStage": 3}})))
    assert main(["render", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "spec.strategy" in captured.err


def test_validate_several_files_and_stdin(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(minimal_job()))
    ok = subprocess.run(
        [*LLMTRAIN, "validate", str(good), *map(str, (REPO_ROOT / "examples").glob("*.yaml"))],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    bad = yaml.safe_dump(minimal_job(resources={"workers": 0, "cpu": "x"}))
    res = subprocess.run([*LLMTRAIN, "validate", "-"], input=bad, capture_output=True, text=True)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2
    assert any("resources.workers" in line for line in lines) and any(
        "resources.cpu" in line for line in lines
    )


def test_validate_unreadable_and_empty_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["validate", str(empty), str(tmp_path / "missing.yaml")]) == 1
    err = capsys.readouterr().err
    assert "no document found" in err and "cannot read" in err


def test_crd_command_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd_yaml()


def test_run_finds_the_trainer_through_its_entry_point() -> None:
    """pyproject declares the entry point, the installed metadata has it, and it is `run_local`."""
    from llmtrain_trainer.local import run_local

    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[cli.TRAINERS_GROUP] == {cli.LOCAL_TRAINER: "llmtrain_trainer.local:run_local"}
    assert cli.local_trainer() is run_local


@pytest.mark.parametrize(
    "installed",
    [
        EntryPoints(()),  # no distribution declares a trainer
        EntryPoints(  # declared, but the trainer package is absent (the operator image)
            [EntryPoint(cli.LOCAL_TRAINER, "llmtrain_no_such_trainer.local:run_local", cli.TRAINERS_GROUP)]
        ),
    ],
    ids=["not-declared", "not-importable"],
)
def test_run_without_a_trainer_says_to_install_the_train_extra(
    installed: EntryPoints,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def lookup(*, group: str, name: str) -> EntryPoints:
        assert group == cli.TRAINERS_GROUP
        return installed.select(name=name)

    monkeypatch.setattr(cli, "entry_points", lookup)
    assert main(["run", str(tmp_path / "job.yaml")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'llmtrain[train]'" in err
