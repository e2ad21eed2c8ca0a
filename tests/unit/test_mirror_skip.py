"""The RayJob mirror skips an event that brings the RayJob state the job's status was last derived
from (`reporting.MIRRORED_FROM`): the echo of the reconciler's own create, KubeRay's finalizer.
Each skip is a GET of the job the API server is not asked; anything else is mirrored as before."""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf
import pytest
from llmtrain.constants import GROUP_VERSION, KIND
from llmtrain.operator import mirror, reporting
from llmtrain.operator.kube import ApiError
from llmtrain.operator.reporting import MirroredFrom
from llmtrain.operator.status import Failure, Refused, Step

LOG = logging.getLogger("test")


def _job(status: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"name": "j", "namespace": "n", "uid": "job-uid", "generation": 1, "resourceVersion": "7"}
    return {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": meta, "spec": {}, "status": status or {}}


def _rayjob(status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    owner = {"apiVersion": GROUP_VERSION, "kind": KIND, "name": "j", "uid": "job-uid", "controller": True}
    metadata = {"name": "j", "namespace": "n", "uid": "ray-uid", "resourceVersion": "10"}
    metadata.update(ownerReferences=[owner], labels={"llmtrain.dev/job": "j"}, **meta)
    return {"metadata": metadata, "spec": {"suspend": True}, "status": status or {}}


class _Kube:
    """The job as stored; counts its GETs and status patches (each patch moves its version)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.gets = 0
        self.patches: list[dict[str, Any]] = []
        self.fail_patch: ApiError | None = None

    def get(self, resource: object, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        return copy.deepcopy(self.job)

    def merge_patch(
        self, resource: object, namespace: str, name: str, body: dict[str, Any], subresource: Any = None
    ) -> dict[str, Any]:
        if subresource == "status":
            if self.fail_patch is not None:
                raise self.fail_patch
            self.patches.append(body)
            self.job["status"] = {**self.job["status"], **body["status"]}
            self.job["metadata"]["resourceVersion"] = str(int(self.job["metadata"]["resourceVersion"]) + 1)
        return self.job

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return body  # an Event


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting, "MIRRORED_FROM", MirroredFrom())
    monkeypatch.setattr(mirror, "MIRRORED_FROM", reporting.MIRRORED_FROM)


def _event(kube: _Kube, rayjob: dict[str, Any], kind: str = "MODIFIED") -> None:
    memo = kopf.Memo(kube=kube, config=None)
    mirror.mirror_rayjob(event={"type": kind, "object": rayjob}, body=rayjob, memo=memo, logger=LOG)


def test_the_echo_of_the_created_rayjob_and_its_finalizer_read_nothing_and_a_new_state_is_mirrored() -> None:
    kube = _Kube(_job())
    created = _rayjob()
    reporting.report(kube, kube.job, created, Step.CREATED)  # type: ignore[arg-type]
    assert len(kube.patches) == 1
    _event(kube, created, "ADDED")  # the watch's echo of the create
    _event(kube, _rayjob(resourceVersion="11", finalizers=["ray.io/rayjob-finalizer"]))
    assert (kube.gets, len(kube.patches)) == (0, 1)
    suspended = _rayjob({"jobDeploymentStatus": "Suspended"}, resourceVersion="12")
    _event(kube, suspended)
    assert (kube.gets, len(kube.patches)) == (1, 2)
    assert kube.job["status"]["phase"] == "Suspended"
    _event(kube, suspended)  # once mirrored, the same state again reads nothing
    assert kube.gets == 1


@pytest.mark.parametrize(
    "outcome", [Refused("quota", 5.0), Failure("CreateFailed", "boom"), Step.KEPT, Step.SYNCED]
)
def test_any_other_report_on_the_job_has_its_next_event_mirrored_again(outcome: Any) -> None:
    kube = _Kube(_job())
    rayjob = _rayjob({"jobDeploymentStatus": "Suspended"})
    reporting.report(kube, kube.job, rayjob, Step.MIRRORED)  # type: ignore[arg-type]
    reporting.report(kube, kube.job, rayjob if outcome is Step.SYNCED else None, outcome)  # type: ignore[arg-type]
    _event(kube, rayjob)
    assert kube.gets == 1


def test_a_failed_write_notes_nothing_and_a_deletion_is_never_skipped() -> None:
    kube = _Kube(_job())
    rayjob = _rayjob({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    kube.fail_patch = ApiError(409, "Conflict", "changed since read")
    with pytest.raises(ApiError):
        reporting.report(kube, kube.job, rayjob, Step.MIRRORED)  # type: ignore[arg-type]
    kube.fail_patch = None
    _event(kube, rayjob)
    assert (kube.gets, kube.job["status"].get("phase")) == (1, "Succeeded")
    _event(kube, rayjob, "DELETED")  # the state just mirrored, seen gone: handled, never skipped
    assert kube.gets == 2


def test_another_job_of_the_name_is_not_taken_for_the_one_mirrored() -> None:
    kube = _Kube(_job())
    rayjob = _rayjob({"jobDeploymentStatus": "Suspended"})
    reporting.report(kube, kube.job, rayjob, Step.MIRRORED)  # type: ignore[arg-type]
    namesake = copy.deepcopy(rayjob)
    namesake["metadata"]["ownerReferences"][0]["uid"] = "another-uid"
    _event(kube, namesake)
    assert kube.gets == 1


def test_the_digests_kept_are_bounded_and_the_oldest_forgotten_first() -> None:
    kept = MirroredFrom(capacity=2)
    for uid in ("a", "b", "c"):
        kept.note(uid, _rayjob())
    assert len(kept) == 2 and not kept.same("a", _rayjob()) and kept.same("c", _rayjob())
