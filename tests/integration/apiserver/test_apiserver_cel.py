"""CEL `x-kubernetes-validations`: messages, field paths, messageExpression and transition rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiError, ApiServer

API, KIND = widgets.API_VERSION, widgets.KIND


async def test_a_failed_rule_reports_its_message_at_its_field_path(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    with pytest.raises(ApiError) as error:
        await bare_apiserver.create(widgets.widget(size=5, maxSize=3))

    assert error.value.status == 422
    assert error.value.causes == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.maxSize",
            "message": 'Invalid value: "object": maxSize must be at least size',
        }
    ]
    assert error.value.body["message"].endswith(
        'spec.maxSize: Invalid value: "object": maxSize must be at least size'
    )
    assert await bare_apiserver.create(widgets.widget(size=3, maxSize=3))


async def test_message_expression_is_used_without_a_message(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    with pytest.raises(ApiError) as error:
        await bare_apiserver.create(widgets.widget(ratio=2))

    assert error.value.causes[0]["message"].endswith("ratio must be below 1, not 2")
    assert error.value.causes[0]["field"] == "spec"


async def test_an_integer_in_a_number_field_is_a_double_in_cel(bare_apiserver: ApiServer) -> None:
    schema = copy.deepcopy(widgets.SCHEMA)
    schema["properties"]["spec"]["x-kubernetes-validations"] = [
        {"rule": "!has(self.ratio) || type(self.ratio) == double", "message": "ratio is not a double"}
    ]
    await bare_apiserver.install_crd(widgets.crd(schema))

    created = await bare_apiserver.create(widgets.widget(ratio=1))

    assert created["spec"]["ratio"] == 1


async def test_transition_rules_run_only_on_update_with_an_old_value(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    await bare_apiserver.create(
        widgets.widget(ports=[{"name": "http", "port": 80}])
    )  # no old value: no check

    added = await bare_apiserver.patch(
        API, KIND, "default", "w", {"spec": {"mode": "fast"}}
    )  # new: no old value
    with pytest.raises(ApiError) as changed:
        await bare_apiserver.patch(API, KIND, "default", "w", {"spec": {"mode": "slow"}})
    with pytest.raises(ApiError) as port:  # map-list items correlate by key with the old object
        await bare_apiserver.patch(
            API, KIND, "default", "w", {"spec": {"ports": [{"name": "http", "port": 81}]}}
        )
    renamed = await bare_apiserver.patch(
        API, KIND, "default", "w", {"spec": {"ports": [{"name": "web", "port": 81}]}}
    )

    assert added["spec"]["mode"] == "fast"
    assert changed.value.causes[0]["field"] == "spec.mode"
    assert changed.value.causes[0]["message"].endswith("mode is immutable")
    assert port.value.causes[0]["field"] == "spec.ports[0].port"
    assert renamed["spec"]["ports"] == [{"name": "web", "port": 81}]


async def test_a_status_write_does_not_trip_transition_rules_on_spec(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    await bare_apiserver.create(widgets.widget(mode="fast"))
    updated = await bare_apiserver.patch_status(API, KIND, "default", "w", {"status": {"phase": "Running"}})
    assert updated["status"]["phase"] == "Running"


async def test_a_crd_with_an_unparsable_rule_is_rejected(bare_apiserver: ApiServer) -> None:
    broken = copy.deepcopy(widgets.SCHEMA)
    broken["properties"]["spec"]["x-kubernetes-validations"] = [{"rule": "self.size >", "message": "x"}]
    with pytest.raises(ApiError) as error:
        await bare_apiserver.create(widgets.crd(broken))

    assert error.value.status == 422
    assert "x-kubernetes-validations[0].rule" in error.value.causes[0]["field"]


async def test_kuberay_managed_by_is_immutable(apiserver: ApiServer) -> None:
    rayjob: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rj"},
        "spec": {"entrypoint": "python x.py", "managedBy": "ray.io/kuberay-operator"},
    }
    await apiserver.create(rayjob)
    with pytest.raises(ApiError) as error:
        await apiserver.patch(
            "ray.io/v1", "RayJob", "default", "rj", {"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}
        )

    assert error.value.causes[0]["field"] == "spec.managedBy"
    assert error.value.causes[0]["message"].endswith("the managedBy field is immutable")
