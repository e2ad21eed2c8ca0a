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
    project_installs = [line for line in installs if "TORCH_SPEC" not in line]
    assert project_installs and all("-c constraints.txt" in line for line in project_installs), installs
    for dockerfile in ("operator/Dockerfile", "trainer_image/Dockerfile"):
        text = (REPO_ROOT / dockerfile).read_text()
        assert "COPY pyproject.toml constraints.txt /tmp/llmtrain/" in text, dockerfile
        # The dependencies (from pyproject.toml's lists), DeepSpeed, and llmtrain itself (`.`).
        project = [
            line
            for line in re.findall(r"pip install[^\n]*", text)
            if "-r requirements.txt" in line or "deepspeed" in line or re.search(r"\s\.(\s|$)", line)
        ]
        assert project and all("-c constraints.txt" in line for line in project), (dockerfile, project)


DOCKERFILES = ("operator/Dockerfile", "trainer_image/Dockerfile")
# What follows `pip install` on one logical line (continuations joined) up to the next `&&`.
_PIP_INSTALL = re.compile(r"pip install ((?:[^&\n]|&(?!&))*)")


def _pip_installs(dockerfile: str) -> list[list[str]]:
    """The arguments of every `pip install` in a Dockerfile, continuation lines joined."""
    text = (REPO_ROOT / dockerfile).read_text().replace("\\\n", " ")
    return [line.split() for line in _PIP_INSTALL.findall(text)]


def test_every_image_pip_install_is_pinned() -> None:
    """Each package an image installs is at an exact version: through constraints.txt, or written
    out (pip, setuptools and wheel before torch; torch and DeepSpeed by their ARGs) and then equal to
    constraints.txt's pin where it has one. An unpinned `pip install --upgrade pip` gets whatever
    is newest on the day of the build."""
    pins = _pins()
    for dockerfile in DOCKERFILES:
        defaults = dict(
            re.findall(r"^ARG (\w+)=(\S+)$", (REPO_ROOT / dockerfile).read_text(), flags=re.MULTILINE)
        )
        installs = _pip_installs(dockerfile)
        assert installs, dockerfile
        for args in installs:
            if "-c" in args and args[args.index("-c") + 1] == "constraints.txt":
                continue
            options_with_value = {"--index-url", "--extra-index-url"}
            wanted = [
                a.strip('"')
                for i, a in enumerate(args)
                if not a.startswith("-") and args[i - 1] not in options_with_value
            ]
            assert wanted, (dockerfile, args)
            for text in wanted:
                requirement = Requirement(re.sub(r"\$\{(\w+)\}", lambda m, d=defaults: d[m.group(1)], text))
                specs = list(requirement.specifier)
                assert len(specs) == 1 and specs[0].operator == "==", f"{dockerfile}: {text} is not pinned"
                spec = specs[0]
                name = canonicalize_name(requirement.name)
                if name in pins:
                    assert Version(spec.version) == pins[name], (dockerfile, text, pins[name])


def test_pip_and_the_build_backend_are_the_tested_versions() -> None:
    """pip, setuptools and wheel are in constraints.txt (the venv's, `make lock`), and the isolated
    build of the project, which constraints.txt does not reach, requires the same exact versions."""
    pins = _pins()
    assert {"pip", "setuptools", "wheel"} <= set(pins)
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for text in requires:
        requirement = Requirement(text)
        (spec,) = requirement.specifier
        assert spec.operator == "==", text
        assert Version(spec.version) == pins[canonicalize_name(requirement.name)], text
    lock = (REPO_ROOT / "hack" / "lock.sh").read_text()
    assert "pip|setuptools|wheel" not in lock, "make lock would drop them from constraints.txt"


def test_the_base_images_can_be_pinned_by_digest() -> None:
    """Every FROM names an ARG holding the image reference (a tag by default), so a build can pin
    it by digest with --build-arg."""
    for dockerfile in DOCKERFILES:
        text = (REPO_ROOT / dockerfile).read_text()
        stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, flags=re.MULTILINE))
        bases = [b for b in re.findall(r"^FROM (\S+)", text, flags=re.MULTILINE) if b not in stages]
        assert bases and all(re.fullmatch(r"\$\{[A-Z_]+\}", b) for b in bases), (dockerfile, bases)
        for base in set(bases):
            assert re.search(rf"^ARG {base[2:-1]}=\S+:\S+$", text, flags=re.MULTILINE), (dockerfile, base)


def test_the_trainer_image_and_make_install_get_the_tracking_clients() -> None:
    """spec.tracking's clients (the [track] extra) are in the requirements the trainer image
    installs (its Dockerfile's own one-liner, run here on pyproject.toml) and in `make install`."""
    dockerfile = (REPO_ROOT / "trainer_image" / "Dockerfile").read_text()
    pattern = r"python -c '([^']*optional-dependencies[^']*)' > /requirements.txt"
    (one_liner,) = re.findall(pattern, dockerfile)
    import contextlib
    import io
    import os

    printed = io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        with contextlib.redirect_stdout(printed):
            exec(one_liner, {})
    finally:
        os.chdir(cwd)
    requirements = set(printed.getvalue().split("\n"))
    track = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "track"
    ]
    assert track and set(track) <= requirements, set(track) - requirements
    assert re.search(r"-e '\.\[[^]]*\btrack\b[^]]*\]'", (REPO_ROOT / "Makefile").read_text())
