"""constraints.txt is the exact set CI and the images install: every dependency pyproject.toml names
(as a range) is pinned there to a version inside that range, and every install uses it."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.jobs import REPO_ROOT

PINNED_ELSEWHERE = {"torch"}  # TORCH_SPEC / the images' TORCH_VERSION (CPU or CUDA build)


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_declared_dependency_is_pinned_inside_its_range() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    pins = _pins()
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in PINNED_ELSEWHERE:
            continue
        assert name in pins, f"{text}: not in constraints.txt (run `make lock`)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (text, pins[name])


def test_torch_and_its_cuda_companions_are_left_to_the_build() -> None:
    assert not [n for n in _pins() if n == "torch" or n.startswith(("nvidia-", "cuda-")) or n == "triton"]


def test_every_install_uses_the_constraints() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    installs = re.findall(r"pip install[^\n]*", makefile)
    project_installs = [line for line in installs if "TORCH_SPEC" not in line and "--upgrade pip" not in line]
    assert project_installs and all("-c constraints.txt" in line for line in project_installs), installs
    for dockerfile in ("operator/Dockerfile", "trainer_image/Dockerfile"):
        text = (REPO_ROOT / dockerfile).read_text()
        assert "COPY pyproject.toml README.md constraints.txt" in text, dockerfile
        project = [
            line for line in re.findall(r"pip install[^\n]*", text) if '".[' in line or "deepspeed" in line
        ]
        assert project and all("-c constraints.txt" in line for line in project), (dockerfile, project)
