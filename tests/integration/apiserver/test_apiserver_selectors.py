"""Label selectors (=, ==, !=, in, notin, key, !key) and field selectors on list and watch."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.apiserver import ApiServer
from tests.support.apiserver.selectors import parse_fields, parse_labels

LABELS = {
    "a": {"app": "web", "tier": "front"},
    "b": {"app": "web", "tier": "back"},
    "c": {"app": "db"},
    "d": {},
}


def configmap(name: str, labels: dict[str, str], namespace: str = "default") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
    }


async def names(server: ApiServer, **selectors: str) -> list[str]:
    listed = await server.list("v1", "configmaps", "default", **selectors)
    return [item["metadata"]["name"] for item in listed["items"]]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web,tier=back", ["b"]),
        ("app!=web", ["c", "d"]),
        ("tier in (front, back)", ["a", "b"]),
        ("tier notin (front)", ["b", "c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("app in (web,db), !tier", ["c"]),
    ],
)
async def test_list_by_label_selector(bare_apiserver: ApiServer, selector: str, expected: list[str]) -> None:
    for name, labels in LABELS.items():
        await bare_apiserver.create(configmap(name, labels))
    assert await names(bare_apiserver, label_selector=selector) == expected


async def test_list_by_field_selector(bare_apiserver: ApiServer) -> None:
    await bare_apiserver.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    for name in ("a", "b"):
        await bare_apiserver.create(configmap(name, {}))
    await bare_apiserver.create(configmap("a", {}, namespace="other"))

    assert await names(bare_apiserver, field_selector="metadata.name=a") == ["a"]
    assert await names(bare_apiserver, field_selector="metadata.name!=a") == ["b"]
    everywhere = await bare_apiserver.list("v1", "configmaps", field_selector="metadata.namespace==other")
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in everywhere["items"]] == [
        ("other", "a")
    ]


@pytest.mark.parametrize(
    "query", ["labelSelector=app%3Dweb!", "labelSelector=a%20in%20b", "fieldSelector=spec.x%3D1"]
)
async def test_a_malformed_selector_is_400(bare_apiserver: ApiServer, query: str) -> None:
    response = await bare_apiserver.request("GET", f"/api/v1/namespaces/default/configmaps?{query}")
    assert response.status == 400


def test_parsing_keeps_commas_inside_parentheses() -> None:
    requirements = parse_labels("env in (prod, staging),!legacy,example.com/team=ml")
    assert [(r.key, r.op, sorted(r.values)) for r in requirements] == [
        ("env", "in", ["prod", "staging"]),
        ("legacy", "!", []),
        ("example.com/team", "=", ["ml"]),
    ]
    assert [(r.key, r.op) for r in parse_fields("metadata.name!=x")] == [("metadata.name", "!=")]


async def test_a_selector_watch_sees_objects_enter_and_leave(bare_apiserver: ApiServer) -> None:
    events: list[tuple[str, str]] = []
    start = (await bare_apiserver.list("v1", "configmaps"))["metadata"]["resourceVersion"]

    async def watch() -> None:
        async for event in bare_apiserver.watch(
            "v1", "configmaps", "default", label_selector="app=web", resource_version=start
        ):
            events.append((event["type"], event["object"]["metadata"]["name"]))

    task = asyncio.create_task(watch())
    await bare_apiserver.create(configmap("x", {"app": "db"}))
    await bare_apiserver.create(configmap("y", {"app": "web"}))
    await bare_apiserver.patch("v1", "configmaps", "default", "x", {"metadata": {"labels": {"app": "web"}}})
    await bare_apiserver.patch("v1", "configmaps", "default", "y", {"metadata": {"labels": {"app": "db"}}})
    await bare_apiserver.patch("v1", "configmaps", "default", "y", {"data": {"k": "v"}})  # invisible
    await bare_apiserver.delete("v1", "configmaps", "default", "x")
    async with asyncio.timeout(5):
        while len(events) < 4:
            await asyncio.sleep(0.01)
    task.cancel()
    assert events == [("ADDED", "y"), ("ADDED", "x"), ("DELETED", "y"), ("DELETED", "x")]


async def test_a_field_selector_watch_sees_one_object(bare_apiserver: ApiServer) -> None:
    events: list[str] = []
    start = (await bare_apiserver.list("v1", "configmaps"))["metadata"]["resourceVersion"]

    async def watch() -> None:
        async for event in bare_apiserver.watch(
            "v1", "configmaps", field_selector="metadata.name=b", resource_version=start
        ):
            events.append(f"{event['type']} {event['object']['metadata']['name']}")

    task = asyncio.create_task(watch())
    for name in ("a", "b", "c"):
        await bare_apiserver.create(configmap(name, {}))
    await bare_apiserver.delete("v1", "configmaps", "default", "b")
    async with asyncio.timeout(5):
        while len(events) < 2:
            await asyncio.sleep(0.01)
    task.cancel()
    assert events == ["ADDED b", "DELETED b"]


async def test_a_list_pages_with_limit_and_continue(bare_apiserver: ApiServer) -> None:
    for name in "abcde":
        await bare_apiserver.create(configmap(name, {}))
    pages, token = [], None
    while True:
        params = {"limit": "2", **({"continue": token} if token else {})}
        response = await bare_apiserver.request("GET", "/api/v1/namespaces/default/configmaps", params=params)
        pages.append([item["metadata"]["name"] for item in response.body["items"]])
        token = response.body["metadata"].get("continue")
        if not token:
            break
    assert pages == [["a", "b"], ["c", "d"], ["e"]]
