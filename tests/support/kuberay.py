"""KubeRay's CRDs for tests, from the KubeRay Go module pinned in hack/tools/kuberay.

The same module builds the KubeRay operator the cluster tier runs, so the schemas the unit tests
check against are the ones the real controller serves. Go's module cache holds the source (first
use downloads it through the Go module proxy); nothing is vendored or read from outside the
repository.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "hack" / "tools"))
import build_tools as tools  # noqa: E402

KUBERAY_VERSION = tools.pinned_version("kuberay")


@functools.cache
def kuberay_crd_dir() -> Path:
    return tools.module_dir("kuberay") / "config" / "crd" / "bases"


@functools.cache
def _load_crd(filename: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((kuberay_crd_dir() / filename).read_text())
    return data


def rayjob_crd() -> dict[str, Any]:
    return _load_crd("ray.io_rayjobs.yaml")


def rayjob_schema() -> dict[str, Any]:
    crd = rayjob_crd()
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema
