"""hack/images.py builds its two chains side by side (python base, then the operator; the CUDA bases,
then the trainer), each after its own bases, and a failed chain fails the run. The bases' and
images' builds are faked (each records when it starts and ends); the order is the real one."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.kuberay import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack"))
import images

SECONDS = {"python": 0.3, "cuda-devel": 0.2, "cuda-runtime": 0.2, "operator": 0.1, "trainer": 0.1}


class Builds:
    """Fake base and image builds that log ("start"|"end", name) in the order they happen."""

    def __init__(self, fail: str | None = None) -> None:
        self.events: list[tuple[str, str]] = []
        self.fail = fail
        self._lock = threading.Lock()

    def _log(self, what: str, name: str) -> None:
        with self._lock:
            self.events.append((what, name))

    def base(self, name: str) -> str:
        self._log("start", name)
        images._say(f"base {name}")
        time.sleep(SECONDS[name])
        self._log("end", name)
        return images.base_ref(name)

    def image(self, name: str, key: str) -> Path:
        self._log("start", name)
        time.sleep(SECONDS[name])
        if name == self.fail:
            raise subprocess.CalledProcessError(1, ["buildah", "build", name])
        archive = images.archive_path(name, key)
        archive.write_bytes(b"archive")
        record = {"ref": images.ref(name, key), "build_seconds": 1}
        archive.with_suffix(".json").write_text(json.dumps(record))
        self._log("end", name)
        return archive

    def index(self, what: str, name: str) -> int:
        return self.events.index((what, name))


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Builds:
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path))
    fake = Builds()
    monkeypatch.setattr(images, "ensure_host_tools", lambda: None)
    monkeypatch.setattr(images, "ensure_base", fake.base)
    monkeypatch.setattr(images, "_build_image", fake.image)
    return fake


def test_each_image_waits_for_its_own_bases_only(builds: Builds, capsys: pytest.CaptureFixture[str]) -> None:
    assert images.main([]) == 0
    assert builds.index("start", "operator") > builds.index("end", "python")
    assert builds.index("start", "trainer") > builds.index("end", "cuda-devel")
    assert builds.index("start", "trainer") > builds.index("end", "cuda-runtime")
    # Side by side: both chains' first bases start before either ends.
    first_end = min(i for i, (what, _) in enumerate(builds.events) if what == "end")
    assert {name for _, name in builds.events[:first_end]} == {"python", "cuda-devel"}
    out = capsys.readouterr().out
    assert "[operator] base python\n" in out and "[trainer] base cuda-runtime\n" in out
    assert out.index("operator: ghcr.io/") < out.index("trainer: ghcr.io/")  # results in order


def test_one_image_builds_its_chain_alone(builds: Builds, capsys: pytest.CaptureFixture[str]) -> None:
    assert images.main(["operator"]) == 0
    chain = [("start", "python"), ("end", "python"), ("start", "operator"), ("end", "operator")]
    assert builds.events == chain
    assert "base python\n" in capsys.readouterr().out  # no prefix: nothing beside it


def test_a_failed_chain_fails_the_run_and_the_other_finishes(
    builds: Builds, capsys: pytest.CaptureFixture[str]
) -> None:
    builds.fail = "trainer"
    assert images.main([]) == 1
    assert ("end", "operator") in builds.events
    captured = capsys.readouterr()
    assert "[trainer] failed after" in captured.out and "CalledProcessError" in captured.out
    assert "operator: ghcr.io/" in captured.out
    # The failed chain's last lines again, after the other chain's: unprefixed, together.
    again = captured.out.split("----- trainer failed; its last lines -----\n")[1]
    assert again.startswith("base cuda-devel\nbase cuda-runtime\nfailed after")
    assert "images.py: trainer failed" in captured.err
