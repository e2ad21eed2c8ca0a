"""`make test`'s three lanes (hack/run_tests.py): every test file runs exactly once, in an order
fit for the machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.kuberay import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack"))  # run_tests imports its sibling as a script does
from hack import run_tests


def test_every_test_file_is_in_exactly_one_lane() -> None:
    assert run_tests.unlaned() == []


def test_a_file_named_by_one_lane_is_left_out_of_its_folders_lane() -> None:
    named = run_tests.named_files()
    assert named, "no lane names a single file: this test has nothing to check"
    for test_file, lane in named.items():
        relative = str(test_file.relative_to(run_tests.REPO_ROOT))
        assert run_tests.lanes_of(test_file) == [lane]
        for other in run_tests.LANES:
            paths = run_tests.pytest_paths(other)
            if other == lane:
                assert relative in paths and f"--ignore={relative}" not in paths
            elif any(relative.startswith(f"{p}/") for p in paths):
                assert f"--ignore={relative}" in paths, (other, paths)


def test_a_file_in_two_lanes_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    lanes = {lane: list(paths) for lane, paths in run_tests.LANES.items()}
    lanes["trainer+pods"].append("tests/unit")
    monkeypatch.setattr(run_tests, "LANES", lanes)
    problems = run_tests.unlaned()
    assert "tests/unit/test_test_lanes.py is in cluster and trainer+pods" in problems, problems


def test_the_kind_run_goes_last_only_where_the_trainer_image_was_never_built(tmp_path: Path) -> None:
    paths = run_tests.LANES["kind"]
    assert paths[0] == run_tests.KIND_RUN
    assert run_tests.kind_lane_order(paths, cold=False) == paths
    cold = run_tests.kind_lane_order(paths, cold=True)
    assert cold == [*paths[1:], run_tests.KIND_RUN]

    assert run_tests.images_never_built(tmp_path)
    (tmp_path / "operator-0123.tar").touch()
    assert run_tests.images_never_built(tmp_path)
    (tmp_path / "trainer-4567.tar").touch()  # an earlier build's key: its layers are cached
    assert not run_tests.images_never_built(tmp_path)
