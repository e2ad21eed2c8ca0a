"""model.name that reads as a hub id but is a folder under the job's paths base resolves the same way
for the driver and every worker, whatever their working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from llmtrain.api.spec import DatasetSpec, ModelSpec
from llmtrain.api.trainer_config import JobRef, ScalingSpec, TrainerConfig
from llmtrain_trainer.model import ModelError
from llmtrain_trainer.weights import local_folder, with_model_folder


def config(base: Path, name: str) -> TrainerConfig:
    return TrainerConfig(
        job=JobRef(name="job"),
        run_name="run",
        storage_path=str(base / "runs"),
        paths_base=str(base),
        scaling=ScalingSpec(num_workers=1),
        model=ModelSpec(name=name),
        dataset=DatasetSpec(path=str(base / "data.txt")),
    )


def test_a_hub_like_name_that_is_a_folder_under_the_base_becomes_that_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exports" / "tiny").mkdir(parents=True)
    resolved = with_model_folder(config(tmp_path, "exports/tiny"))
    assert resolved.model.name == str(tmp_path / "exports" / "tiny")
    # A worker in another working directory loads the same folder, never the hub.
    monkeypatch.chdir(tmp_path.parent)
    assert local_folder(resolved.model) == tmp_path / "exports" / "tiny"


def test_a_hub_id_with_no_such_folder_stays_a_hub_id(tmp_path: Path) -> None:
    assert (
        with_model_folder(config(tmp_path, "meta-llama/Llama-3.2-1B")).model.name == "meta-llama/Llama-3.2-1B"
    )


def test_a_cwd_folder_is_not_mistaken_for_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the paths base counts: a folder that merely exists in this process's cwd is not used."""
    (tmp_path / "cwd" / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert with_model_folder(config(tmp_path / "base", "org/model")).model.name == "org/model"


def test_an_absolute_name_that_is_missing_fails_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    with pytest.raises(ModelError, match="no such folder"):
        local_folder(ModelSpec(name=str(missing)))
    assert not os.path.exists(missing)
