"""Discovery and CRD lifecycle: what Kopf and kubectl-like clients learn from `/api` and `/apis`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiServer
from tests.support.apiserver.fixtures import PROJECT_CRD_DIR, crd_documents


async def resources(server: ApiServer, group_version: str) -> dict[str, dict[str, Any]]:
    path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
    response = await server.request("GET", path)
    assert response.status == 200, response.body
    return {r["name"]: r for r in response.body["resources"]}


async def test_kuberay_crds_are_served_with_their_status_subresource(apiserver: ApiServer) -> None:
    groups = (await apiserver.request("GET", "/apis")).body["groups"]
    ray = next(g for g in groups if g["name"] == "ray.io")
    served = await resources(apiserver, "ray.io/v1")

    assert ray["preferredVersion"]["version"] == "v1"
    for plural, kind in (("rayjobs", "RayJob"), ("rayclusters", "RayCluster")):
        assert served[plural]["kind"] == kind
        assert served[plural]["namespaced"] is True
        assert {"get", "list", "watch", "create", "patch", "delete"} <= set(served[plural]["verbs"])
        assert f"{plural}/status" in served

    await apiserver.create(
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"}, "spec": {}}
    )
    old_version = await apiserver.get("ray.io/v1alpha1", "rayjobs", "default", "rj")
    assert old_version["apiVersion"] == "ray.io/v1alpha1"  # one object, served by every version


async def test_the_project_crds_are_installed(apiserver: ApiServer) -> None:
    for crd in crd_documents(PROJECT_CRD_DIR) if PROJECT_CRD_DIR.is_dir() else []:
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("storage"))
        served = await resources(apiserver, f"{spec['group']}/{version}")
        assert spec["names"]["plural"] in served
        assert (
            apiserver.stored(
                "apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd["metadata"]["name"]
            )
            is not None
        )


async def test_builtin_resources_the_operator_uses_are_served(bare_apiserver: ApiServer) -> None:
    core = await resources(bare_apiserver, "v1")
    assert {
        "namespaces",
        "configmaps",
        "secrets",
        "persistentvolumeclaims",
        "serviceaccounts",
        "events",
    } <= set(core)
    assert "namespaces/status" in core
    for group_version, plural in (
        ("events.k8s.io/v1", "events"),
        ("rbac.authorization.k8s.io/v1", "roles"),
        ("rbac.authorization.k8s.io/v1", "rolebindings"),
        ("coordination.k8s.io/v1", "leases"),
        ("apiextensions.k8s.io/v1", "customresourcedefinitions"),
    ):
        assert plural in await resources(bare_apiserver, group_version), group_version


def test_crd_files_are_found_in_a_directory(tmp_path: Path) -> None:
    documents = [widgets.crd(), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-a-crd"}}]
    (tmp_path / "example.yaml").write_text(yaml.safe_dump_all(documents))
    (tmp_path / "notes.txt").write_text("ignored")
    assert [d["metadata"]["name"] for d in crd_documents(tmp_path)] == ["widgets.example.com"]


async def test_a_created_crd_is_served_and_established_and_unserved_when_deleted(
    bare_apiserver: ApiServer,
) -> None:
    created = await bare_apiserver.create(widgets.crd())
    await bare_apiserver.create(widgets.widget())
    crd = bare_apiserver.stored(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", None, "widgets.example.com"
    )
    assert "status" not in created
    assert crd is not None
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
    assert "widgets" in await resources(bare_apiserver, "example.com/v1")

    await bare_apiserver.delete(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", None, "widgets.example.com"
    )
    listed = await bare_apiserver.request("GET", "/apis/example.com/v1/namespaces/default/widgets")
    groups = (await bare_apiserver.request("GET", "/apis")).body["groups"]
    assert listed.status == 404
    assert "example.com" not in {g["name"] for g in groups}
