"""Status codes where Kubernetes gives them: 201, 404, 409 (exists / stale), 422 (failed JSON-patch test)."""

from __future__ import annotations

import pytest

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiError, ApiServer

API, KIND = widgets.API_VERSION, widgets.KIND
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}}


async def test_create_is_201_and_creating_again_is_409_already_exists(bare_apiserver: ApiServer) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    created = await bare_apiserver.request("POST", path, body=CONFIGMAP)
    again = await bare_apiserver.request("POST", path, body=CONFIGMAP)

    assert created.status == 201
    assert again.status == 409
    assert again.body["reason"] == "AlreadyExists"
    assert again.body["message"] == 'configmaps "cm" already exists'


@pytest.mark.parametrize("method", ["GET", "PATCH", "DELETE"])
async def test_a_missing_object_is_404(bare_apiserver: ApiServer, method: str) -> None:
    body = {"data": {"a": "2"}} if method == "PATCH" else None
    response = await bare_apiserver.request(
        method,
        "/api/v1/namespaces/default/configmaps/nope",
        body=body,
        content_type="application/merge-patch+json",
    )

    assert response.status == 404
    assert response.body["reason"] == "NotFound"
    assert response.body["message"] == 'configmaps "nope" not found'


async def test_a_missing_namespace_or_resource_is_404(bare_apiserver: ApiServer) -> None:
    with pytest.raises(ApiError) as namespace:
        await bare_apiserver.create(CONFIGMAP, namespace="ghost")
    unknown = await bare_apiserver.request("GET", "/apis/example.com/v1/namespaces/default/widgets")

    assert namespace.value.status == 404
    assert namespace.value.body["message"] == 'namespaces "ghost" not found'
    assert unknown.status == 404


async def test_a_stale_resource_version_is_409_conflict(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    stale = await bare_apiserver.create(widgets.widget())
    await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"size": 2}})

    with pytest.raises(ApiError) as patch:
        await bare_apiserver.patch(
            API,
            KIND,
            "default",
            "w",
            {"metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]}, "spec": {"size": 3}},
        )
    with pytest.raises(ApiError) as put:
        await bare_apiserver.replace({**stale, "spec": {"size": 4}})

    for error in (patch.value, put.value):
        assert error.status == 409
        assert error.reason == "Conflict"
        assert "the object has been modified" in error.body["message"]
    assert bare_apiserver.stored(API, KIND, "default", "w")["spec"]["size"] == 2  # type: ignore[index]


async def test_a_put_of_a_custom_resource_needs_a_resource_version(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    current = await bare_apiserver.create(widgets.widget())
    replaced = await bare_apiserver.replace({**current, "spec": {"size": 9}})
    del replaced["metadata"]["resourceVersion"]

    with pytest.raises(ApiError) as error:
        await bare_apiserver.replace(replaced)
    assert error.value.status == 422
    assert error.value.causes[0]["field"] == "metadata.resourceVersion"


async def test_a_failed_json_patch_test_op_is_422(bare_apiserver: ApiServer) -> None:
    created = await bare_apiserver.create(CONFIGMAP)
    rv = created["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "replace", "path": "/data/a", "value": "2"},
    ]
    await bare_apiserver.patch("v1", "configmaps", "default", "cm", ops)

    with pytest.raises(ApiError) as error:
        await bare_apiserver.patch("v1", "configmaps", "default", "cm", ops)  # rv is stale now
    assert error.value.status == 422
    assert bare_apiserver.stored("v1", "configmaps", "default", "cm")["data"] == {"a": "2"}  # type: ignore[index]


async def test_server_side_apply_and_strategic_patches_of_custom_resources_are_415(
    bare_apiserver: ApiServer,
) -> None:
    await widgets.install(bare_apiserver)
    await bare_apiserver.create(widgets.widget())
    path = bare_apiserver.path(API, KIND, "default", "w")
    for media in ("application/apply-patch+yaml", "application/strategic-merge-patch+json"):
        response = await bare_apiserver.request("PATCH", path, body={"spec": {"size": 2}}, content_type=media)
        assert response.status == 415, media
