"""Kopf's watch stream without managedFields (`llmtrain.operator.slim`)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kopf._cogs.clients import watching
from llmtrain.operator import slim


def stored(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "llmtrain.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {
            "name": name,
            "namespace": "n",
            "resourceVersion": "7",
            "labels": {"a": "b"},
            "managedFields": [{"manager": "kopf", "operation": "Update", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"model": {"name": "m"}},
        "status": {"phase": "Pending", "kopf": {"lastHandled": "{}"}},
    }


def test_kopf_queues_watch_events_and_listed_objects_without_managed_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed, modified = stored("a"), stored("b")
    source: list[Any] = [
        {"type": None, "object": listed},
        watching.Bookmark.LISTED,
        {"type": "MODIFIED", "object": modified},
        {"type": "BOOKMARK", "object": {"kind": "X", "metadata": {"resourceVersion": "9"}}},
    ]
    expected = copy.deepcopy(source)
    for item in (expected[0], expected[2]):
        del item["object"]["metadata"]["managedFields"]
    seen: dict[str, Any] = {}

    async def continuous_watch(**kwargs: Any) -> AsyncIterator[Any]:
        seen.update(kwargs)
        for item in source:
            yield item

    monkeypatch.setattr(watching, "continuous_watch", continuous_watch)
    slim.install()
    wrapped = watching.continuous_watch
    slim.install()
    assert watching.continuous_watch is wrapped, "wrapped once"

    async def drain() -> list[Any]:
        return [item async for item in watching.continuous_watch(resource="r", namespace=None)]

    assert asyncio.run(drain()) == expected
    assert seen == {"resource": "r", "namespace": None}


def test_kopf_still_reaches_its_watch_stream_by_that_name() -> None:
    """The wrapper works only while Kopf's `infinite_watch` looks `continuous_watch` up in its
    module at each call (kopf._cogs.clients.watching, pinned by constraints.txt)."""
    assert "continuous_watch" in watching.infinite_watch.__code__.co_names
    assert watching.infinite_watch.__globals__ is vars(watching)
