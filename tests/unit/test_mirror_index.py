"""The RayJob mirror reads its job from Kopf's index (`mirror.index_copy`), not with a GET per RayJob
event, and a stale copy never lands: the status write stays conditional on the copy's
resourceVersion, and its 409 sends the mirror to the API server for the job as it is now."""

from __future__ import annotations

import logging
from typing import Any

from llmtrain.constants import GROUP_VERSION, KIND
from llmtrain.operator import mirror
from llmtrain.operator.kube import ApiError


class StoredJob:
    """A stand-in for the API server holding one job: GETs counted, status patches conditional."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.gets = 0
        self.status_patches: list[dict[str, Any]] = []

    def get(self, _res: Any, _namespace: str, _name: str) -> dict[str, Any]:
        self.gets += 1
        return mirror.copy_of(self.job)

    def merge_patch(
        self, _res: Any, _ns: str, _name: str, patch: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        assert subresource == "status"
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != self.job["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        self.status_patches.append(patch)
        self.job["status"] = {**self.job["status"], **patch["status"]}
        self.job["metadata"]["resourceVersion"] = str(int(self.job["metadata"]["resourceVersion"]) + 1)
        return self.job

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:  # Events
        return obj


class Memo:
    def __init__(self, kube: StoredJob) -> None:
        self.kube = kube
        self.config = None


def _job(resource_version: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": {"name": "j", "namespace": "n", "uid": "u1", "resourceVersion": resource_version},
        "spec": {"runPolicy": {"suspend": True}, "model": {"big": "spec"}},
        "status": status,
    }


def _rayjob(state: str) -> dict[str, Any]:
    ref = {"apiVersion": GROUP_VERSION, "kind": KIND, "name": "j", "uid": "u1", "controller": True}
    return {
        "metadata": {"name": "j", "namespace": "n", "ownerReferences": [ref], "labels": {}},
        "spec": {"suspend": True},
        "status": {"jobDeploymentStatus": state},
    }


Index = dict[tuple[str, str], list[dict[str, Any]]]


def _mirror(kube: StoredJob, index: Index, rayjob: dict[str, Any]) -> None:
    mirror.mirror_rayjob(
        {"type": "MODIFIED"},  # type: ignore[arg-type]
        rayjob,  # type: ignore[arg-type]
        Memo(kube),  # type: ignore[arg-type]
        logging.getLogger("test"),  # type: ignore[arg-type]
        job_copies=index,  # type: ignore[arg-type]
    )


CREATED = {"phase": "Pending", "rayJobName": "j", "observedGeneration": 1}


def test_the_mirror_writes_from_the_indexed_copy_without_reading_the_job() -> None:
    stored = StoredJob(_job("5", dict(CREATED)))
    index = {("n", "j"): list(mirror.index_copy(stored.job).values())}  # type: ignore[arg-type]
    _mirror(stored, index, _rayjob("Suspended"))
    assert stored.gets == 0
    assert [p["status"]["phase"] for p in stored.status_patches] == ["Suspended"]
    assert stored.status_patches[0]["metadata"] == {"resourceVersion": "5"}


def test_a_stale_copy_costs_a_409_and_the_job_is_read_then() -> None:
    stored = StoredJob(_job("5", dict(CREATED)))
    index = {("n", "j"): list(mirror.index_copy(stored.job).values())}  # type: ignore[arg-type]
    stored.job["metadata"]["resourceVersion"] = "6"  # changed since indexed (e.g. the resync wrote)
    _mirror(stored, index, _rayjob("Suspended"))
    assert stored.gets == 1
    assert [p["metadata"]["resourceVersion"] for p in stored.status_patches] == ["6"]


def test_a_job_not_indexed_or_of_another_uid_is_read() -> None:
    stored = StoredJob(_job("5", dict(CREATED)))
    _mirror(stored, {}, _rayjob("Suspended"))
    assert stored.gets == 1
    namesake = _job("3", dict(CREATED))
    namesake["metadata"]["uid"] = "u0"  # an earlier job of the name, still in the index
    index = {("n", "j"): list(mirror.index_copy(namesake).values())}  # type: ignore[arg-type]
    _mirror(stored, index, _rayjob("Running"))
    assert stored.gets == 2


def test_the_indexed_copy_leaves_out_the_spec_and_kopfs_bookkeeping() -> None:
    job = _job("5", {**CREATED, "kopf": {"lastHandled": "a copy of the spec"}})
    (copy,) = mirror.index_copy(job).values()  # type: ignore[arg-type]
    assert copy["spec"] == {"runPolicy": {"suspend": True}}
    assert "kopf" not in copy["status"] and copy["status"]["phase"] == "Pending"
    held = mirror.indexed_owner({("n", "j"): [copy]}, _rayjob("Running"))  # type: ignore[arg-type]
    assert held is not None
    held["status"]["phase"] = "Running"
    held["metadata"]["labels"]["x"] = "y"
    assert copy["status"]["phase"] == "Pending" and "x" not in copy["metadata"].get("labels", {})
