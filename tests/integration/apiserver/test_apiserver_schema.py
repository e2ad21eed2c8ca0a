"""CRD structural schemas: validation (422 with causes), defaulting and pruning as Kubernetes does them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiError, ApiServer

API, KIND = widgets.API_VERSION, widgets.KIND


async def rejected(server: ApiServer, obj: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as error:
        await server.create(obj)
    assert error.value.status == 422
    assert error.value.reason == "Invalid"
    return error.value


async def test_violations_are_422_with_a_cause_per_field(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    error = await rejected(bare_apiserver, widgets.widget(size="big", color="blue", title="toolongtitle"))

    causes = {c["field"]: c for c in error.causes}
    assert set(causes) == {"spec.size", "spec.color", "spec.title"}
    assert causes["spec.title"]["reason"] == "FieldValueTooLong"
    assert causes["spec.size"]["reason"] == "FieldValueTypeInvalid"
    assert 'must be of type integer: "string"' in causes["spec.size"]["message"]
    assert causes["spec.color"]["message"] == 'Unsupported value: "blue": supported values: "red", "green"'
    assert error.body["message"].startswith('Widget.example.com "w" is invalid: [')


async def test_required_fields_and_bounds(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    missing = await rejected(bare_apiserver, {**widgets.widget(), "spec": {"color": "red"}})
    too_big = await rejected(bare_apiserver, widgets.widget(size=101))

    assert missing.causes == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.size"}
    ]
    assert too_big.causes[0]["field"] == "spec.size"
    assert "less than or equal to 100" in too_big.causes[0]["message"]


async def test_defaults_are_applied_on_create_and_update(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    created = await bare_apiserver.create(widgets.widget(config={}))
    cleared = await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"color": None, "limits": None}})
    # A null in a non-nullable field is dropped before defaulting, not rejected.
    nulls = await bare_apiserver.replace(
        {**cleared, "spec": {**cleared["spec"], "color": None, "maxSize": None}}
    )

    for obj in (created, cleared, nulls):
        assert obj["spec"]["color"] == "red"
        assert obj["spec"]["limits"] == {"cpu": "1"}  # a defaulted object gets its own nested defaults
    assert created["spec"]["config"] == {"level": 3}
    assert "maxSize" not in nulls["spec"]


async def test_unknown_fields_are_pruned_unless_preserved(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    created = await bare_apiserver.create(
        {
            **widgets.widget(config={"anything": {"goes": [1]}}, typo=True),
            "extra": "dropped",
            "metadata": {"name": "w", "unknownMetaField": 1, "labels": {"kept": "yes"}},
        }
    )

    assert "typo" not in created["spec"]
    assert "extra" not in created
    assert "unknownMetaField" not in created["metadata"]
    assert created["metadata"]["labels"] == {"kept": "yes"}
    assert created["spec"]["config"] == {"anything": {"goes": [1]}, "level": 3}


async def test_int_or_string_nullable_and_embedded_resources(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    template = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}, "bogus": 1},
        "spec": {"image": "busybox", "unknown": 1},
    }
    created = await bare_apiserver.create(widgets.widget("a", replicas="50%", note=None, template=template))
    numeric = await bare_apiserver.create(widgets.widget("b", replicas=3))
    error = await rejected(bare_apiserver, widgets.widget("c", replicas=1.5))

    assert created["spec"]["replicas"] == "50%"
    assert numeric["spec"]["replicas"] == 3
    assert created["spec"]["note"] is None  # nullable: the null is kept, not pruned
    assert created["spec"]["template"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {"image": "busybox"},
    }
    assert error.causes[0]["field"] == "spec.replicas"


async def test_list_types_set_and_map_reject_duplicates(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    tags = await rejected(bare_apiserver, widgets.widget(tags=["a", "b", "a"]))
    ports = await rejected(
        bare_apiserver, widgets.widget(ports=[{"name": "http"}, {"name": "http", "port": 1}])
    )

    assert tags.causes[0] == {
        "reason": "FieldValueDuplicate",
        "message": 'Duplicate value: "a"',
        "field": "spec.tags[2]",
    }
    assert ports.causes[0]["field"] == "spec.ports[1]"


async def test_metadata_is_validated_for_every_kind(bare_apiserver: ApiServer) -> None:
    bad = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "Bad_Name", "labels": {"k": "a" * 64}},
    }
    error = await rejected(bare_apiserver, bad)
    assert [c["field"] for c in error.causes] == ["metadata.name", "metadata.labels"]


async def test_kuberay_rayjob_crd_validates_defaults_and_prunes(apiserver: ApiServer) -> None:
    rayjob: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rj"},
        "spec": {
            "entrypoint": "python train.py",
            "notAField": 1,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {
                        "metadata": {"labels": {"app": "x"}},
                        "spec": {"containers": [{"name": "head", "image": "ray"}]},
                    },
                }
            },
        },
    }
    created = await apiserver.create(rayjob)
    error = await rejected(
        apiserver,
        {**rayjob, "metadata": {"name": "bad"}, "spec": {**rayjob["spec"], "backoffLimit": "twice"}},
    )

    assert "notAField" not in created["spec"]
    assert created["spec"]["submissionMode"] == "K8sJobMode"  # KubeRay's default
    head = created["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert head["metadata"] == {"labels": {"app": "x"}}
    assert error.causes[0]["field"] == "spec.backoffLimit"


async def test_unchanged_values_are_not_validated_again_on_update(bare_apiserver: ApiServer) -> None:
    """Validation ratcheting: a value the CRD has since tightened survives writes that leave it alone."""
    await widgets.install(bare_apiserver)
    await bare_apiserver.create(widgets.widget(title="abcdefgh", tags=["a"]))
    tightened = copy.deepcopy(widgets.SCHEMA)
    spec = tightened["properties"]["spec"]["properties"]
    spec["title"]["maxLength"] = 4
    spec["tags"]["x-kubernetes-validations"] = [
        {"rule": "self != oldSelf", "message": "tags must change on every write"}
    ]
    crd = await bare_apiserver.get(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", None, widgets.crd()["metadata"]["name"]
    )
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = tightened
    await bare_apiserver.replace(crd)

    with pytest.raises(ApiError) as unchanged_tags:  # a transition rule runs even on an unchanged value
        await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"color": "green"}})
    kept = await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"color": "green", "tags": ["b"]}})
    with pytest.raises(ApiError) as changed_title:
        await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"title": "abcdefghi", "tags": ["c"]}})

    assert unchanged_tags.value.causes[0]["field"] == "spec.tags"
    assert kept["spec"]["title"] == "abcdefgh" and kept["spec"]["color"] == "green"
    assert [c["field"] for c in changed_title.value.causes] == ["spec.title"]
