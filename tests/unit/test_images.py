"""hack/images.py: what an image's cache key covers, and that the Dockerfiles build FROM the base
and keep llmtrain's own code in the last layers (no image is built here; tests/images does that)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.kuberay import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack"))
import images

COPIED = ("pyproject.toml", "README.md", "constraints.txt", ".dockerignore", "operator", "trainer_image")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The parts of the repository a build context holds, plus a file no image copies."""
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.tar.gz"))
        else:
            shutil.copy(source, tmp_path / name)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("x = 1\n")
    return tmp_path


def _keys(root: Path) -> dict[str, str]:
    return {name: images.image_key(name, root) for name in images.IMAGES}


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_the_key_is_stable_and_ignores_what_no_image_copies(tree: Path) -> None:
    before = _keys(tree)
    assert before == _keys(tree)
    _append(tree / "tests" / "test_x.py", "y = 2\n")
    (tree / "operator" / "llmtrain" / "__pycache__").mkdir(exist_ok=True)
    (tree / "operator" / "llmtrain" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    (tree / "charts").mkdir()
    (tree / "charts" / "values.yaml").write_text("a: 1\n")
    assert _keys(tree) == before


@pytest.mark.parametrize(
    ("changed", "rebuilt"),
    [
        ("operator/Dockerfile", {"operator"}),
        ("trainer_image/Dockerfile", {"trainer"}),
        ("constraints.txt", {"operator", "trainer"}),
        ("pyproject.toml", {"operator", "trainer"}),
        # An empty README.md serves pyproject's long description: editing the README rebuilds
        # no image (it did, ~8 minutes for the trainer).
        ("README.md", set()),
        ("operator/llmtrain/cli.py", {"operator", "trainer"}),
        ("trainer_image/llmtrain_trainer/loop.py", {"trainer"}),
        (".dockerignore", {"operator", "trainer"}),
    ],
)
def test_a_change_to_what_an_image_copies_changes_its_key(
    tree: Path, changed: str, rebuilt: set[str]
) -> None:
    before = _keys(tree)
    _append(tree / changed, "\n# changed\n")
    after = _keys(tree)
    assert {name for name in before if before[name] != after[name]} == rebuilt


def test_a_new_source_file_changes_the_key(tree: Path) -> None:
    before = _keys(tree)
    (tree / "trainer_image" / "llmtrain_trainer" / "new_module.py").write_text("")
    assert _keys(tree)["trainer"] != before["trainer"]


def test_the_aws_ofi_nccl_source_in_the_context_builds_the_plugin(tree: Path) -> None:
    """Without the release archive in trainer_image/fabric/ the build says so (AWS_OFI_NCCL_SOURCE=
    none); with it, the Dockerfile's own default stands and the archive is part of the key."""
    assert images.build_args("trainer", tree)["AWS_OFI_NCCL_SOURCE"] == "none"
    before = images.image_key("trainer", tree)
    name, _ = images.fabric_archive_name(tree)
    (tree / "trainer_image" / "fabric" / name).write_bytes(b"release archive")
    assert "AWS_OFI_NCCL_SOURCE" not in images.build_args("trainer", tree)
    assert images.image_key("trainer", tree) != before


def _from_args(dockerfile: str) -> set[str]:
    text = (REPO_ROOT / dockerfile).read_text()
    return {m for m in re.findall(r"^FROM \$\{(\w+)\}", text, re.M)}


def _declared_args(dockerfile: str) -> set[str]:
    return set(re.findall(r"^\s*ARG (\w+)", (REPO_ROOT / dockerfile).read_text(), re.M))


@pytest.mark.parametrize("name", sorted(images.IMAGES))
def test_the_local_build_replaces_every_base_and_only_declared_args(name: str) -> None:
    """Every FROM is one of the base arguments the local build sets to a Debian base made here, and
    every build argument it passes is one the Dockerfile declares (buildah ignores unknown ones)."""
    image = images.IMAGES[name]
    assert _from_args(image.dockerfile) == set(image.bases)
    passed = set(images.build_args(name)) | ({"AWS_OFI_NCCL_SOURCE"} if name == "trainer" else set())
    assert passed <= _declared_args(image.dockerfile)
    for arg, base in image.bases.items():
        assert images.build_args(name)[arg] == images.base_ref(base)


@pytest.mark.parametrize("name", sorted(images.IMAGES))
def test_the_code_is_copied_only_after_the_dependencies(name: str) -> None:
    """llmtrain's code is copied only in the last stage, after the venv: a code change
    rebuilds only those layers, not the dependencies (torch, Ray) or the venv's copy."""
    text = (REPO_ROOT / images.IMAGES[name].dockerfile).read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)
    last = stages[-1]
    code = ("operator/llmtrain", "trainer_image/llmtrain_trainer", "README.md")
    for stage in stages[:-1]:
        copies = re.findall(r"^COPY (?!--from)(.+)$", stage, re.M)
        assert not [c for c in copies if any(p in c for p in code)], (name, copies)
    venv = last.index("COPY --from=build /opt/venv /opt/venv")
    first_code = min(last.index(f"COPY {p}") for p in ("pyproject.toml constraints.txt", "operator/llmtrain"))
    assert venv < first_code
    assert not re.search(r"^RUN .*apt-get|pip install -r", last[first_code:], re.M)


def test_the_build_context_holds_what_the_dockerfiles_copy() -> None:
    """.dockerignore is an allow-list: a COPY source missing from it would fail the build."""
    allowed = {
        line[1:] for line in (REPO_ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    }
    for image in images.IMAGES.values():
        text = (REPO_ROOT / image.dockerfile).read_text()
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
            for source in line.split()[:-1]:
                assert source.rstrip("/") in allowed, (image.dockerfile, source)


def test_the_cache_honours_llmtrain_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path))
    assert images.archive_path("operator", "k").parent == tmp_path / "images"
    assert images.archive_path("operator", "k").name == "operator-k.tar"
    assert images.ref("trainer", "k") == "ghcr.io/llmtrain/trainer:local-k"
