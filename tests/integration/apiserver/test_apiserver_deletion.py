"""Deletion: ownerReference cascades, finalizers with deletionTimestamp, propagation policies, namespaces."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiError, ApiServer

API, KIND = widgets.API_VERSION, widgets.KIND


def owned(name: str, owner: dict[str, Any], *, block: bool = False, **meta: Any) -> dict[str, Any]:
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": block,
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "ownerReferences": [ref], **meta},
    }


def exists(server: ApiServer, kind: str, name: str, api: str = "v1") -> bool:
    return server.stored(api, kind, "default", name) is not None


async def test_deleting_an_owner_deletes_its_dependents_recursively(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    parent = await bare_apiserver.create(widgets.widget("parent"))
    child = await bare_apiserver.create(owned("child", parent))
    await bare_apiserver.create(owned("grandchild", child))
    await bare_apiserver.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}})

    await bare_apiserver.delete(API, KIND, "default", "parent")

    assert not exists(bare_apiserver, KIND, "parent", API)
    assert not exists(bare_apiserver, "ConfigMap", "child")
    assert not exists(bare_apiserver, "ConfigMap", "grandchild")
    assert exists(bare_apiserver, "ConfigMap", "unrelated")


async def test_finalizers_hold_a_deleted_object_until_they_are_removed(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    await bare_apiserver.create(
        {**widgets.widget(), "metadata": {"name": "w", "finalizers": ["example.com/x"]}}
    )

    deleting = await bare_apiserver.request("DELETE", bare_apiserver.path(API, KIND, "default", "w"))
    again = await bare_apiserver.delete(API, KIND, "default", "w")
    held = bare_apiserver.stored(API, KIND, "default", "w")
    assert deleting.status == 202
    assert held is not None
    assert held["metadata"]["deletionTimestamp"] == deleting.body["metadata"]["deletionTimestamp"]
    assert held["metadata"]["generation"] == 2  # marking for deletion is a new generation
    assert again["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]  # no second deletion

    with pytest.raises(ApiError) as error:
        await bare_apiserver.patch(
            API, KIND, "default", "w", {"metadata": {"finalizers": ["example.com/x", "new"]}}
        )
    assert error.value.status == 422
    await bare_apiserver.patch(API, KIND, "default", "w", {"metadata": {"finalizers": None}})
    assert not exists(bare_apiserver, KIND, "w", API)


async def test_a_dependent_with_finalizers_is_only_marked(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    parent = await bare_apiserver.create(widgets.widget("parent"))
    await bare_apiserver.create(owned("child", parent, finalizers=["example.com/keep"]))

    await bare_apiserver.delete(API, KIND, "default", "parent")

    child = bare_apiserver.stored("v1", "ConfigMap", "default", "child")
    assert child is not None
    assert child["metadata"]["deletionTimestamp"]


async def test_foreground_deletion_waits_for_blocking_dependents(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    parent = await bare_apiserver.create(widgets.widget("parent"))
    await bare_apiserver.create(owned("child", parent, block=True, finalizers=["example.com/keep"]))

    await bare_apiserver.delete(API, KIND, "default", "parent", propagation_policy="Foreground")
    waiting = bare_apiserver.stored(API, KIND, "default", "parent")
    assert waiting is not None
    assert waiting["metadata"]["finalizers"] == ["foregroundDeletion"]

    await bare_apiserver.patch("v1", "configmaps", "default", "child", {"metadata": {"finalizers": None}})
    assert not exists(bare_apiserver, KIND, "parent", API)
    assert not exists(bare_apiserver, "ConfigMap", "child")


async def test_orphan_deletion_keeps_dependents_without_the_reference(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    parent = await bare_apiserver.create(widgets.widget("parent"))
    await bare_apiserver.create(owned("child", parent))

    await bare_apiserver.delete(API, KIND, "default", "parent", propagation_policy="Orphan")

    child = bare_apiserver.stored("v1", "ConfigMap", "default", "child")
    assert child is not None
    assert child["metadata"]["ownerReferences"] == []


async def test_deleting_a_namespace_deletes_its_content_first(bare_apiserver: ApiServer) -> None:
    await bare_apiserver.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    await bare_apiserver.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "held", "namespace": "team", "finalizers": ["x/y"]},
        }
    )

    await bare_apiserver.delete("v1", "namespaces", None, "team")
    namespace = bare_apiserver.stored("v1", "namespaces", None, "team")
    assert namespace is not None
    assert namespace["status"]["phase"] == "Terminating"
    with pytest.raises(ApiError) as error:
        await bare_apiserver.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}, namespace="team"
        )
    assert error.value.status == 403

    await bare_apiserver.patch("v1", "configmaps", "team", "held", {"metadata": {"finalizers": None}})
    assert bare_apiserver.stored("v1", "namespaces", None, "team") is None
