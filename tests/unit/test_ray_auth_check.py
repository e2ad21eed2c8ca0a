"""A RayJob the API server stored without `authOptions` (a RayJob CRD older than KubeRay v1.5.1) is
stopped and its job failed, never resumed by a later sync, and its later states are not mirrored
over the failure. The cluster tier prunes the field from the live CRD (tests/cluster/test_ray_auth.py).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.operator import children
from llmtrain.operator.children import AuthDropped, auth_dropped, drift_patch, ensure_all
from llmtrain.operator.kube import ApiError
from llmtrain.operator.status import AUTH_UNSUPPORTED, Failure, Step, operator_status
from llmtrain.render import render

from tests.support.jobs import minimal_job

NOW = "2026-11-26T10:00:00Z"


def _objects() -> list[dict[str, Any]]:
    doc = minimal_job(
        "open",
        "team",
        resources={"workers": 1, "gpusPerWorker": 0, "cpu": "1", "memory": "2Gi", "sharedMemory": "1Gi"},
    )
    return render(parse_job(doc))


def _pruned(rayjob: dict[str, Any]) -> dict[str, Any]:
    stored = copy.deepcopy(rayjob)
    del stored["spec"]["rayClusterSpec"]["authOptions"]
    return stored


class Kube:
    """Creates return the object as an old RayJob CRD stores it; patches are recorded."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def get(self, resource: Any, namespace: str, name: str) -> dict[str, Any]:
        raise ApiError(404, "NotFound", f"{name} not found")  # every child is new

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return _pruned(obj) if obj["kind"] == "RayJob" else copy.deepcopy(obj)

    def merge_patch(self, resource: Any, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append((name, patch))
        return {}


def test_a_rayjob_stored_without_auth_is_suspended_and_refused() -> None:
    objects = _objects()
    rayjob = objects[-1]
    assert rayjob["kind"] == "RayJob" and not auth_dropped(rayjob, rayjob)
    kube = Kube()
    with pytest.raises(AuthDropped, match=r"KubeRay v1\.5\.1"):
        ensure_all(kube, objects)  # type: ignore[arg-type]
    assert kube.patches == [(rayjob["metadata"]["name"], {"spec": {"suspend": True}})]


def test_a_later_sync_never_resumes_it() -> None:
    rayjob = _objects()[-1]
    stopped = _pruned(rayjob)
    stopped["spec"]["suspend"] = True
    assert "suspend" not in drift_patch(rayjob, stopped).get("spec", {})
    assert drift_patch(rayjob, {**copy.deepcopy(rayjob), "spec": {**rayjob["spec"], "suspend": True}}) == {
        "spec": {"suspend": False}
    }
    assert children.rayjob_synced_fields(rayjob, stopped) == (
        "ttlSecondsAfterFinished",
        "activeDeadlineSeconds",
        "preRunningDeadlineSeconds",
    )


def test_the_failure_is_not_overwritten_by_the_stopped_rayjobs_states() -> None:
    rayjob = _pruned(_objects()[-1])
    job: dict[str, Any] = {"metadata": {"name": "open", "namespace": "team", "generation": 1}, "status": {}}
    failed = operator_status(job, None, Failure(AUTH_UNSUPPORTED, "no auth"), NOW)
    job["status"] = failed.update
    assert job["status"]["phase"] == "Failed"
    rayjob["status"] = {"jobDeploymentStatus": "Suspended"}
    assert operator_status(job, rayjob, Step.MIRRORED, NOW).update == {}
