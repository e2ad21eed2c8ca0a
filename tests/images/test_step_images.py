"""A rebuild after a change removes the superseded build's step images from buildah's storage and
keeps the layer cache the new build uses (hack/images.py). Without it a long-lived machine kept
every superseded trainer build (several GB each) until its disk filled up during an image build.

Real buildah on tiny `FROM scratch` images: a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kuberay import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack"))
import images

TAG = "localhost/llmtrain-test/step-images:1"
_BUILT: list[str] = []  # every step image the tests made, removed after each test


def _build(context: Path, changed: str) -> list[str]:
    (context / "changed").write_text(changed)
    cmd = ["buildah", "build", "--layers", "--isolation", "chroot", "--pull=never", "-t", TAG, str(context)]
    steps = images.step_images(images.build_teed(cmd, cwd=context))
    _BUILT.extend(steps)
    return steps


def _stored(image: str) -> bool:
    inspected = subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True)
    return inspected.returncode == 0


@pytest.fixture
def context(tmp_path: Path) -> Iterator[Path]:
    images.ensure_host_tools()
    (tmp_path / "Containerfile").write_text(
        "FROM scratch AS first\nCOPY stable /stable\n"
        "FROM scratch\nCOPY --from=first /stable /stable\nCOPY changed /changed\n"
    )
    (tmp_path / "stable").write_text("the same in every build\n")
    yield tmp_path
    subprocess.run(["buildah", "rmi", "--force", TAG], capture_output=True)
    for image in reversed(_BUILT):
        subprocess.run(["buildah", "rmi", image], capture_output=True)
    _BUILT.clear()


def test_a_rebuild_removes_the_superseded_steps_and_keeps_the_cache_it_uses(context: Path) -> None:
    first = _build(context, "one\n")
    assert len(first) >= 2 and all(_stored(image) for image in first), first
    unrelated = _build(context, "two\n")  # stands for another image's build, whose steps are kept
    third = _build(context, "three\n")
    # The stable steps come from the cache: the same images in every build; the last step differs.
    assert first[:-1] == unrelated[:-1] == third[:-1], (first, unrelated, third)
    assert len({first[-1], unrelated[-1], third[-1]}) == 3

    stale = images.superseded(first, third, kept=set(unrelated))
    assert stale == [first[-1]], stale
    assert images.superseded(first, third, kept={first[-1]}) == []
    assert images.prune_step_images(stale) == stale
    assert not _stored(first[-1])
    assert all(_stored(image) for image in third + unrelated)


def test_tagged_images_are_never_pruned(context: Path) -> None:
    steps = _build(context, "tagged\n")
    assert images.prune_step_images([steps[-1]]) == []
    assert _stored(TAG)
