"""The server stamps what the API server owns: uid, creationTimestamp, resourceVersion, generation, name."""

from __future__ import annotations

import re

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiServer

API, KIND = widgets.API_VERSION, widgets.KIND


async def test_create_stamps_uid_creation_timestamp_and_resource_version(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    first = await bare_apiserver.create(widgets.widget("a"))
    second = await bare_apiserver.create(widgets.widget("b"))

    meta = first["metadata"]
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", meta["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["uid"] != second["metadata"]["uid"]
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert bare_apiserver.stored(API, KIND, "default", "a") == first


async def test_every_write_bumps_the_resource_version_but_a_no_op_does_not(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    created = await bare_apiserver.create(widgets.widget(size=1))
    patched = await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"size": 2}})
    status = await bare_apiserver.patch_status(API, KIND, "default", "w", {"status": {"phase": "Running"}})
    same = await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"size": 2}})

    versions = [int(o["metadata"]["resourceVersion"]) for o in (created, patched, status, same)]
    assert versions[0] < versions[1] < versions[2] == versions[3]
    assert created["metadata"]["uid"] == status["metadata"]["uid"]
    assert created["metadata"]["creationTimestamp"] == status["metadata"]["creationTimestamp"]


async def test_generation_starts_at_1_and_counts_spec_changes_only(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    assert (await bare_apiserver.create(widgets.widget()))["metadata"]["generation"] == 1

    labelled = await bare_apiserver.patch(API, KIND, "default", "w", {"metadata": {"labels": {"a": "b"}}})
    with_status = await bare_apiserver.patch_status(
        API, KIND, "default", "w", {"status": {"phase": "Running"}}
    )
    assert labelled["metadata"]["generation"] == with_status["metadata"]["generation"] == 1

    changed = await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"size": 5}})
    assert changed["metadata"]["generation"] == 2
    forged = await bare_apiserver.patch(API, KIND, "default", "w", {"metadata": {"generation": 40}})
    assert forged["metadata"]["generation"] == 2


async def test_generate_name_gets_a_random_suffix(bare_apiserver: ApiServer) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "cfg-"}}
    first = await bare_apiserver.create(body)
    second = await bare_apiserver.create(body)

    assert re.fullmatch(r"cfg-[a-z0-9]{5}", first["metadata"]["name"])
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert bare_apiserver.stored("v1", "configmaps", "default", first["metadata"]["name"]) is not None
