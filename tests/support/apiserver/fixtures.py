"""pytest plugin with the test API server fixtures.

Register it once, in the root conftest: `pytest_plugins = ["tests.support.apiserver.fixtures"]`.

- `apiserver`: a running server with KubeRay's RayJob/RayCluster CRDs and every CRD in
  `manifests/crds/*.yaml` installed;
- `bare_apiserver`: the same server with builtin resources only, for tests that bring their own CRDs.

Both point `$KUBECONFIG`, the official `kubernetes` client and Kopf's default login at the server.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tests.support.apiserver.server import ApiServer
from tests.support.kuberay import REPO_ROOT, kuberay_crd_dir

PROJECT_CRD_DIR = REPO_ROOT / "manifests" / "crds"
KUBERAY_CRD_FILES = ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml")
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # KubeRay's CRDs are 2 MB of YAML


@functools.cache
def _documents(path: Path, mtime: float) -> tuple[dict[str, Any], ...]:
    return tuple(d for d in yaml.load_all(path.read_text(), Loader=_Loader) if isinstance(d, dict))


def crd_documents(directory: Path, names: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions in `directory/*.yaml` (or in the named files), parsed once per run."""
    paths = [directory / n for n in names] if names is not None else sorted(directory.glob("*.yaml"))
    return [
        d
        for p in paths
        for d in _documents(p, p.stat().st_mtime)
        if d.get("kind") == "CustomResourceDefinition"
    ]


def write_kubeconfig(url: str, path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test-apiserver",
        "clusters": [{"name": "test-apiserver", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {"token": "test"}}],
        "contexts": [
            {
                "name": "test-apiserver",
                "context": {"cluster": "test-apiserver", "user": "test", "namespace": "default"},
            }
        ],
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def use_kubeconfig(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every client in this process talk to the server at `path`, until the test ends.

    `kubernetes` freezes `$KUBECONFIG` into a module constant at import time (and Kopf imports it early),
    so the constant is patched too; without `KUBERNETES_SERVICE_HOST` Kopf does not try in-cluster login.
    """
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    try:
        import kubernetes
    except ImportError:  # the operator extra is not installed: nothing else to configure
        return
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", None)  # restored after the test
    kubernetes.config.load_kube_config(config_file=str(path))  # type: ignore[no-untyped-call]


@pytest_asyncio.fixture
async def bare_apiserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ApiServer]:
    """A running test API server with the builtin resources and namespaces, and a kubeconfig for it."""
    server = ApiServer()
    server.start()
    errors: list[Exception] = []
    try:
        server.kubeconfig = write_kubeconfig(server.url, tmp_path / "kubeconfig")
        use_kubeconfig(server.kubeconfig, monkeypatch)
        yield server
        errors = server.internal_errors()
    finally:
        await server.aclose()
    if errors:
        raise AssertionError(
            f"the test API server failed internally (a bug in tests/support/apiserver): {errors!r}"
        )


@pytest_asyncio.fixture
async def apiserver(bare_apiserver: ApiServer) -> ApiServer:
    """`bare_apiserver` plus KubeRay's RayJob and RayCluster CRDs and the project's own CRDs."""
    for crd in crd_documents(kuberay_crd_dir(), KUBERAY_CRD_FILES):
        await bare_apiserver.install_crd(crd)
    if PROJECT_CRD_DIR.is_dir():
        for crd in crd_documents(PROJECT_CRD_DIR):
            await bare_apiserver.install_crd(crd)
    return bare_apiserver
