"""Fault injection: the next N matching requests fail (500, 429 + Retry-After, 409) or are slowed down."""

from __future__ import annotations

import time

import pytest

from tests.support.apiserver import ApiError, ApiServer

CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}


async def test_the_next_n_matching_requests_fail_then_requests_succeed(bare_apiserver: ApiServer) -> None:
    await bare_apiserver.create(CONFIGMAP)
    fault = bare_apiserver.faults.fail("get", "configmaps", 500, times=2)

    statuses = [
        (await bare_apiserver.request("GET", "/api/v1/namespaces/default/configmaps/cm")).status
        for _ in range(3)
    ]
    listed = await bare_apiserver.list("v1", "configmaps", "default")  # another verb: unaffected

    assert statuses == [500, 500, 200]
    assert fault.hits == 2
    assert [r.method for r in bare_apiserver.requests()][-4:] == ["GET"] * 4  # failed ones are logged too
    assert [i["metadata"]["name"] for i in listed["items"]] == ["cm"]


async def test_429_carries_retry_after(bare_apiserver: ApiServer) -> None:
    bare_apiserver.faults.fail("create", "configmaps", 429, retry_after=2)
    with pytest.raises(ApiError) as error:
        await bare_apiserver.create(CONFIGMAP)

    assert error.value.status == 429
    assert error.value.reason == "TooManyRequests"
    assert error.value.headers["Retry-After"] == "2"


async def test_a_failed_request_changes_nothing(bare_apiserver: ApiServer) -> None:
    await bare_apiserver.create(CONFIGMAP)
    bare_apiserver.faults.fail("patch", "configmaps", 409, message="injected conflict")
    with pytest.raises(ApiError) as error:
        await bare_apiserver.patch("v1", "configmaps", "default", "cm", {"data": {"a": "1"}})

    assert error.value.status == 409
    assert error.value.body["message"] == "injected conflict"
    assert "data" not in bare_apiserver.stored("v1", "configmaps", "default", "cm")  # type: ignore[operator]


async def test_subresources_are_matched_separately(bare_apiserver: ApiServer) -> None:
    bare_apiserver.faults.fail("patch", "namespaces/status", 500, times=None)
    main = await bare_apiserver.patch(
        "v1", "namespaces", None, "default", {"metadata": {"labels": {"a": "b"}}}
    )
    with pytest.raises(ApiError):
        await bare_apiserver.patch_status(
            "v1", "namespaces", None, "default", {"status": {"phase": "Active"}}
        )
    assert main["metadata"]["labels"] == {"a": "b"}


async def test_latency_is_added_to_matching_requests(bare_apiserver: ApiServer) -> None:
    slow = bare_apiserver.faults.delay("list", "*", 0.5, times=1)
    started = time.monotonic()
    await bare_apiserver.list("v1", "configmaps", "default")
    first = time.monotonic() - started
    started = time.monotonic()
    await bare_apiserver.list("v1", "configmaps", "default")
    second = time.monotonic() - started

    assert first >= 0.5
    assert second < 0.5
    assert slow.hits == 1
