"""Run the real operator (Kopf, in a KopfRunner thread) over HTTP against the test API server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import kopf
import pytest
import pytest_asyncio
from kopf.testing import KopfRunner
from llmtrain.operator.permissions import granted

from tests.support.apiserver.server import ApiServer
from tests.support.jobs import minimal_job

JOB = ("llmtrain.dev/v1alpha1", "LLMTrainingJob")
RAYJOB = ("ray.io/v1", "RayJob")
NS = "default"


@contextlib.contextmanager
def running_operator(timeout: float = 60) -> Iterator[KopfRunner]:
    settings = kopf.OperatorSettings()
    with KopfRunner(
        ["run", "--standalone", "--all-namespaces", "--verbose", "-m", "llmtrain.operator.handlers"],
        settings=settings,
        timeout=timeout,
    ) as runner:
        yield runner
    assert runner.exception is None, runner.output[-5000:]


@pytest_asyncio.fixture
async def operator(apiserver: ApiServer) -> AsyncIterator[KopfRunner]:
    with running_operator() as runner:
        yield runner


def tiny_job(name: str = "tiny", **spec: Any) -> dict[str, Any]:
    doc = minimal_job(name, NS, **spec)
    doc["spec"]["storage"] = spec.get("storage", {"create": {"size": "1Gi"}})
    return doc


async def eventually(check: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    """Poll until check() returns a truthy value (asyncio-friendly: the server runs in a thread)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(AssertionError, KeyError, TypeError):
            last = check()
            if last:
                return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


def stored_job(server: ApiServer, name: str) -> dict[str, Any] | None:
    return server.stored(*JOB, NS, name)


def stored_rayjob(server: ApiServer, name: str) -> dict[str, Any] | None:
    return server.stored(*RAYJOB, NS, name)


def phase_of(server: ApiServer, name: str) -> str | None:
    job = stored_job(server, name)
    return ((job or {}).get("status") or {}).get("phase")


def conditions_of(server: ApiServer, name: str) -> dict[str, dict[str, Any]]:
    job = stored_job(server, name) or {}
    return {c["type"]: c for c in (job.get("status") or {}).get("conditions") or []}


async def set_rayjob_status(server: ApiServer, name: str, status: dict[str, Any]) -> None:
    """Play KubeRay: write the RayJob's status through its status subresource."""
    await server.patch_status(*RAYJOB, NS, name, {"status": status})


def events_for(server: ApiServer, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in server.stored_items("v1", "events", NS)
        if (e.get("involvedObject") or {}).get("name") == name
    ]


def _verb(method: str, name: str | None, params: dict[str, str]) -> str:
    if method == "GET":
        return "get" if name else ("watch" if params.get("watch") in ("true", "1") else "list")
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]


def operator_calls(server: ApiServer) -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) of every request the operator made.

    The test's own client is aiohttp ("Python/3.x aiohttp/..."); Kopf and the kubernetes client
    identify themselves otherwise."""
    calls = set()
    for req in server.requests():
        agent = req.headers.get("User-Agent", "")
        if agent.startswith("Python/") or req.resource is None or not req.resource.plural:
            continue
        resource = req.resource.plural + (f"/{req.subresource}" if req.subresource else "")
        calls.add((req.resource.group or "", resource, _verb(req.method.value, req.name, dict(req.params))))
    return calls


@pytest.fixture(autouse=True)
def operator_stays_within_its_rbac(apiserver: ApiServer) -> Iterator[None]:
    """After every scenario: each call the operator made is granted by the declared permissions
    (the chart's RBAC is generated from the same list)."""
    yield
    calls = operator_calls(apiserver)
    SEEN_CALLS.update(calls)
    denied = sorted(c for c in calls if not granted(*c))
    assert not denied, f"the operator used calls its RBAC does not grant: {denied}"


SEEN_CALLS: set[tuple[str, str, str]] = set()
