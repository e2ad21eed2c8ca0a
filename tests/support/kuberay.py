"""Locate the pinned KubeRay v1.7.0 CRDs for tests.

Order: ../shared/kuberay beside the checkout (CI), then $KUBERAY_CRD_DIR, then a download of the
pinned files into a cache when a network is there. Never vendored into the repository.
"""

from __future__ import annotations

import functools
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

KUBERAY_VERSION = "v1.7.0"
_FILES = ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml")
_URL = "https://raw.githubusercontent.com/ray-project/kuberay/{v}/ray-operator/config/crd/bases/{f}"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _has_all(d: Path) -> bool:
    return all((d / f).is_file() for f in _FILES)


def _download(dest: Path) -> bool:
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for f in _FILES:
            if not (dest / f).is_file():
                with urllib.request.urlopen(_URL.format(v=KUBERAY_VERSION, f=f), timeout=20) as r:
                    (dest / f).write_bytes(r.read())
        return True
    except OSError:
        return False


@functools.cache
def kuberay_crd_dir() -> Path | None:
    candidates = [REPO_ROOT.parent / "shared" / "kuberay"]
    if os.environ.get("KUBERAY_CRD_DIR"):
        candidates.append(Path(os.environ["KUBERAY_CRD_DIR"]))
    for d in candidates:
        if _has_all(d):
            return d
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llmtrain" / "kuberay"
    cache = cache / KUBERAY_VERSION
    if _has_all(cache) or _download(cache):
        return cache
    return None


def require_kuberay_crd_dir() -> Path:
    d = kuberay_crd_dir()
    if d is None:
        pytest.skip(
            "KubeRay v1.7.0 CRDs not found: expected ../shared/kuberay/ray.io_rayjobs.yaml, "
            "or $KUBERAY_CRD_DIR, or network access to download them"
        )
    return d


@functools.cache
def _load_crd(filename: str) -> dict[str, Any]:
    d = require_kuberay_crd_dir()
    data: dict[str, Any] = yaml.safe_load((d / filename).read_text())
    return data


def rayjob_crd() -> dict[str, Any]:
    return _load_crd("ray.io_rayjobs.yaml")


def rayjob_schema() -> dict[str, Any]:
    crd = rayjob_crd()
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema
