"""Watches: initial state, resuming from `?resourceVersion=`, no gap after a list, timeouts, 410 Gone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.support.apiserver import ApiServer


def configmap(name: str, value: str = "0") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}


async def collect(server: ApiServer, until_rv: int, **kwargs: Any) -> list[tuple[str, str, int]]:
    """Events as (type, name, resourceVersion) until one reaches `until_rv`."""
    events = []
    async with asyncio.timeout(10):
        async for event in server.watch("v1", "configmaps", "default", **kwargs):
            meta = event["object"]["metadata"]
            events.append((event["type"], meta["name"], int(meta["resourceVersion"])))
            if events[-1][2] >= until_rv:
                break
    return events


async def test_a_watch_without_resource_version_starts_with_the_current_state(
    bare_apiserver: ApiServer,
) -> None:
    old = await bare_apiserver.create(configmap("old"))
    events: list[tuple[str, str, str]] = []

    async def watch() -> None:
        async for event in bare_apiserver.watch("v1", "configmaps", "default"):
            meta = event["object"]["metadata"]
            events.append((event["type"], meta["name"], meta["resourceVersion"]))

    watching = asyncio.create_task(watch())
    async with asyncio.timeout(5):
        while not events:
            await asyncio.sleep(0.01)
        new = await bare_apiserver.create(configmap("new"))
        while len(events) < 2:
            await asyncio.sleep(0.01)
    watching.cancel()
    assert events == [
        ("ADDED", "old", old["metadata"]["resourceVersion"]),
        ("ADDED", "new", new["metadata"]["resourceVersion"]),
    ]


async def test_a_watch_resumes_after_its_resource_version(bare_apiserver: ApiServer) -> None:
    created = await bare_apiserver.create(configmap("a"))
    first = await bare_apiserver.patch("v1", "configmaps", "default", "a", {"data": {"v": "1"}})
    await bare_apiserver.create(configmap("b"))
    await bare_apiserver.delete("v1", "configmaps", "default", "b")
    last = await bare_apiserver.patch("v1", "configmaps", "default", "a", {"data": {"v": "2"}})

    events = await collect(
        bare_apiserver,
        until_rv=int(last["metadata"]["resourceVersion"]),
        resource_version=first["metadata"]["resourceVersion"],
    )

    assert [(kind, name) for kind, name, _ in events] == [("ADDED", "b"), ("DELETED", "b"), ("MODIFIED", "a")]
    assert all(rv > int(first["metadata"]["resourceVersion"]) for _, _, rv in events)
    assert int(created["metadata"]["resourceVersion"]) < int(first["metadata"]["resourceVersion"])


async def test_list_then_watch_loses_and_repeats_nothing_under_concurrent_writes(
    bare_apiserver: ApiServer,
) -> None:
    written: list[int] = []

    async def writer() -> None:
        for i in range(40):
            created = await bare_apiserver.create(configmap(f"cm{i}"))
            patched = await bare_apiserver.patch(
                "v1", "configmaps", "default", f"cm{i}", {"data": {"v": "1"}}
            )
            written.extend(int(o["metadata"]["resourceVersion"]) for o in (created, patched))

    writing = asyncio.create_task(writer())
    async with asyncio.timeout(5):
        while len(written) < 4:
            await asyncio.sleep(0.001)
    listed = await bare_apiserver.list("v1", "configmaps", "default")
    list_rv = int(listed["metadata"]["resourceVersion"])
    await writing
    events = await collect(bare_apiserver, until_rv=written[-1], resource_version=str(list_rv))

    seen_rvs = [rv for _, _, rv in events]
    assert 0 < len(listed["items"]) < 40, "the list should land while the writer is still writing"
    assert seen_rvs == sorted(set(seen_rvs)), "no duplicates, in order"
    assert seen_rvs == [rv for rv in written if rv > list_rv], "every write after the list, and nothing else"
    listed_names = {i["metadata"]["name"] for i in listed["items"]}
    added_names = {name for kind, name, _ in events if kind == "ADDED"}
    assert listed_names | added_names == {f"cm{i}" for i in range(40)}
    assert not listed_names & added_names


async def test_a_watch_ends_after_timeout_seconds(bare_apiserver: ApiServer) -> None:
    started = time.monotonic()
    async with asyncio.timeout(5):
        events = [e async for e in bare_apiserver.watch("v1", "configmaps", "default", timeout_seconds=0.3)]
    assert events == []
    assert 0.25 < time.monotonic() - started < 3


async def test_a_watch_from_a_compacted_resource_version_is_410_gone(bare_apiserver: ApiServer) -> None:
    old = await bare_apiserver.create(configmap("a"))
    await bare_apiserver.patch("v1", "configmaps", "default", "a", {"data": {"v": "1"}})
    bare_apiserver.compact()

    async with asyncio.timeout(5):
        events = [
            e
            async for e in bare_apiserver.watch(
                "v1", "configmaps", "default", resource_version=old["metadata"]["resourceVersion"]
            )
        ]
    assert [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"
