"""Scenario 1: create → every child exists with an owner reference and the rendered content."""

from __future__ import annotations

import asyncio

from llmtrain.api.validation import parse_job
from llmtrain.render import render

from tests.integration.operator.conftest import (
    NS,
    conditions_of,
    events_for,
    eventually,
    phase_of,
    stored_rayjob,
    tiny_job,
)
from tests.support.apiserver.server import ApiServer

CHILDREN = [
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "ConfigMap"),
    ("ray.io/v1", "RayJob"),
]


async def test_create_renders_every_child_with_owner_reference(
    apiserver: ApiServer, operator: object
) -> None:
    created = await apiserver.create(tiny_job("tiny"))
    uid = created["metadata"]["uid"]
    await eventually(lambda: stored_rayjob(apiserver, "tiny"), what="the RayJob")
    await eventually(lambda: phase_of(apiserver, "tiny") == "Pending", what="phase Pending")

    expected = {(o["apiVersion"], o["kind"]): o for o in render(parse_job(created))}
    assert set(expected) == set(CHILDREN)
    for api_version, kind in CHILDREN:
        want = expected[(api_version, kind)]
        got = apiserver.stored(api_version, kind, NS, want["metadata"]["name"])
        assert got is not None, kind
        (owner,) = got["metadata"]["ownerReferences"]
        assert owner["uid"] == uid and owner["controller"] is True and owner["kind"] == "LLMTrainingJob"
        for field in ("spec", "data", "rules", "subjects", "roleRef"):
            if field in want:
                assert got[field] == _as_stored(want[field], got[field]), (kind, field)
    conditions = conditions_of(apiserver, "tiny")
    assert conditions["Created"]["status"] == "True"
    assert conditions["Created"]["observedGeneration"] == 1


def _as_stored(want: object, got: object) -> object:
    """The API server adds defaults (e.g. to the RayJob pod templates); compare what we rendered."""
    if isinstance(want, dict) and isinstance(got, dict):
        return {k: _as_stored(v, got.get(k)) for k, v in want.items()} | {
            k: v for k, v in got.items() if k not in want
        }
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [_as_stored(w, g) for w, g in zip(want, got, strict=True)]
    return want


async def test_only_transitions_and_errors_become_events(apiserver: ApiServer, operator: object) -> None:
    """Kopf posts its info log lines as Events by default ("Logging"); the operator posts only its own."""
    await apiserver.create(tiny_job("quiet"))
    await eventually(
        lambda: "Created" in [e["reason"] for e in events_for(apiserver, "quiet")], what="the Created event"
    )
    await asyncio.sleep(1)  # Kopf posts Events from a background queue

    assert "Logging" not in [e["reason"] for e in events_for(apiserver, "quiet")]
