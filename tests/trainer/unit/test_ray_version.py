"""The driver's check of the image's Ray against the RayJob's rayVersion (llmtrain_trainer/ray_version.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llmtrain_trainer.main as trainer_main
import pytest
import ray
from llmtrain.constants import RAY_VERSION_ENV
from llmtrain_trainer.ray_version import RayVersionMismatch, check_ray_version

from tests.support.trainer import tiny_config, write_config


def test_agreeing_versions_and_a_local_run_pass() -> None:
    assert check_ray_version("2.60.0", "2.60.0") is None
    assert check_ray_version(None, "2.60.0") is None  # llmtrain run: no RayJob declares one
    assert check_ray_version("", "2.60.0") is None


def test_a_patch_release_apart_warns_naming_both_and_the_field() -> None:
    warning = check_ray_version("2.60.0", "2.60.1")
    assert warning is not None and "2.60.1" in warning and "2.60.0" in warning
    assert "spec.resources.rayVersion" in warning


@pytest.mark.parametrize(
    ("declared", "installed", "named"),
    [
        ("2.60.0", "2.53.0", "spec.resources.rayVersion"),
        ("2.53.0", "2.60.0", "trainerImage.rayVersion"),
        ("2.60.0", "3.0.0", "spec.resources.rayVersion"),
        ("2.60.0", "3.0.0.dev0", "spec.resources.rayVersion"),
        ("2.60.0", "nightly", "spec.resources.rayVersion"),
        # An image whose Ray predates token auth: its dashboard would be open whatever is declared.
        ("2.52.0", "2.51.2", "older than 2.52.0"),
    ],
)
def test_a_different_minor_or_an_unauthenticated_ray_fails(declared: str, installed: str, named: str) -> None:
    with pytest.raises(RayVersionMismatch) as caught:
        check_ray_version(declared, installed)
    assert installed in str(caught.value) and declared in str(caught.value) and named in str(caught.value)


def test_the_driver_fails_before_ray_starts_and_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A RayJob that declares another Ray than the image's: exit 2, the reason in the job status."""
    reported: list[str] = []

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray started despite the mismatch")

    monkeypatch.setattr("ray.init", forbidden)
    monkeypatch.setattr(trainer_main, "run_training", forbidden)
    monkeypatch.setattr(trainer_main, "report_failure", lambda config, message: reported.append(message))
    monkeypatch.setenv(RAY_VERSION_ENV, "2.53.0")
    path = write_config(tiny_config(tmp_path, "mismatch"), tmp_path / "trainer-config.json")
    assert trainer_main.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"the image has Ray {ray.__version__} but the RayJob declares rayVersion 2.53.0" in err
    assert len(reported) == 1 and "spec.resources.rayVersion" in reported[0]
