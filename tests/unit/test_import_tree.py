"""The suite imports the checkout it runs from, in-process and in the processes it starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import llmtrain
import llmtrain_trainer

REPO = Path(__file__).resolve().parents[2]


def test_product_packages_come_from_this_checkout() -> None:
    assert Path(llmtrain.__file__).resolve().is_relative_to(REPO / "operator")
    assert Path(llmtrain_trainer.__file__).resolve().is_relative_to(REPO / "trainer_image")


def test_child_processes_import_this_checkout(tmp_path: Path) -> None:
    """A child started from elsewhere (as the operator process and Ray workers are) sees the same tree."""
    code = "import llmtrain, llmtrain_trainer; print(llmtrain.__file__); print(llmtrain_trainer.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert Path(out[0]).resolve().is_relative_to(REPO / "operator")
    assert Path(out[1]).resolve().is_relative_to(REPO / "trainer_image")
