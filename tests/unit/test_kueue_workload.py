"""The operator's decisions about a queued job's Kueue Workload (operator/workload.py), with the
Workloads in the shapes the real Kueue v0.19.2 writes (pkg/controller/core/workload_controller.go:
`DeactivationTarget` first, then `spec.active: false`, then `Evicted` with reason
`DeactivatedDueTo<cause>`). The cluster tier shows the same against the real Kueue."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest
from llmtrain.constants import SUSPENDED_BY_USER_ANNOTATION
from llmtrain.operator import reconcile, reporting, startup, workload
from llmtrain.operator.kube import ApiError
from llmtrain.operator.status import KUEUE_DEACTIVATED, Step, operator_status

GROUP_V1BETA2 = {
    "kind": "APIGroup",
    "name": "kueue.x-k8s.io",
    "versions": [
        {"groupVersion": "kueue.x-k8s.io/v1beta2", "version": "v1beta2"},
        {"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"},
    ],
    "preferredVersion": {"groupVersion": "kueue.x-k8s.io/v1beta2", "version": "v1beta2"},
}
GROUP_V1BETA1 = {
    "kind": "APIGroup",
    "name": "kueue.x-k8s.io",
    "versions": [{"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"}],
    "preferredVersion": {"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"},
}


def wl(
    *, active: bool = True, ours: bool = False, conditions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "rayjob-j-1a2b3", "namespace": "n"}
    if ours:
        meta["annotations"] = {SUSPENDED_BY_USER_ANNOTATION: "true"}
    return {"metadata": meta, "spec": {"active": active}, "status": {"conditions": conditions or []}}


def cond(ctype: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": "True", "reason": reason, "message": message}


# Kueue's two stages of its own deactivation for a maximum execution time, and its eviction for
# the requeuing limit; an administrator's `kueuectl stop workload` (no cause).
TARGETED = wl(
    active=False,
    conditions=[
        cond("DeactivationTarget", "MaximumExecutionTimeExceeded", "exceeding the maximum execution time")
    ],
)
MAX_TIME = wl(
    active=False,
    conditions=[
        cond(
            "Evicted",
            "DeactivatedDueToMaximumExecutionTimeExceeded",
            "The workload is deactivated due to exceeding the maximum execution time",
        )
    ],
)
REQUEUE_LIMIT = wl(
    active=False,
    conditions=[
        cond(
            "Evicted",
            "DeactivatedDueToRequeuingLimitExceeded",
            "The workload is deactivated due to exceeding the maximum number of re-queuing retries",
        )
    ],
)
BY_ADMIN = wl(active=False, conditions=[cond("Evicted", "Deactivated", "The workload is deactivated")])
BY_US = wl(
    active=False, ours=True, conditions=[cond("Evicted", "Deactivated", "The workload is deactivated")]
)


class FakeKube:
    """Serves Kueue's discovery document (None: Kueue not installed) and the job's Workloads."""

    def __init__(self, workloads: list[dict[str, Any]], group: dict[str, Any] | None = GROUP_V1BETA2) -> None:
        self.workloads = workloads
        self.group = group
        self.requests: list[str] = []
        self.listed: list[str] = []
        self.patched: list[tuple[str, str, dict[str, Any]]] = []

    def request(self, method: str, path: str, *_: Any) -> dict[str, Any]:
        self.requests.append(path)
        if self.group is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return self.group

    def list_all(
        self, res: Any, namespace: Any, label_selector: Any = None, **_: Any
    ) -> list[dict[str, Any]]:
        self.listed.append(f"{res.group}/{res.version}/{res.plural}?{label_selector}")
        if res.plural == "workloads":
            return self.workloads
        return []

    def merge_patch(
        self, res: Any, namespace: str, name: str, body: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        self.patched.append((f"{res.version}/{res.plural}", name, body))
        return {}

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return obj


@pytest.fixture(autouse=True)
def fresh_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "KUEUE_API", workload.KueueApi())


RAYJOB = {
    "apiVersion": "ray.io/v1",
    "kind": "RayJob",
    "metadata": {"name": "j", "namespace": "n", "uid": "r-uid", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
    "spec": {"suspend": True},
    "status": {"jobDeploymentStatus": "Suspended"},
}


@pytest.mark.parametrize(
    ("stored", "cause"),
    [
        (TARGETED, "MaximumExecutionTimeExceeded"),
        (MAX_TIME, "MaximumExecutionTimeExceeded"),
        (REQUEUE_LIMIT, "RequeuingLimitExceeded"),
    ],
)
def test_a_workload_kueue_deactivated_is_never_activated_again(stored: dict[str, Any], cause: str) -> None:
    kube = FakeKube([stored])
    synced = workload.set_active(kube, RAYJOB, True)  # type: ignore[arg-type]
    assert kube.patched == [], "Kueue's verdict is never undone"
    assert synced.deactivation is not None and synced.deactivation.by_kueue
    assert synced.deactivation.cause == cause
    assert cause in synced.deactivation.describe()


def test_an_administrators_deactivation_is_kept_but_is_no_verdict_on_the_job() -> None:
    kube = FakeKube([BY_ADMIN])
    synced = workload.set_active(kube, RAYJOB, True)  # type: ignore[arg-type]
    assert kube.patched == []
    assert synced.deactivation is not None and not synced.deactivation.by_kueue
    assert "kueuectl" in synced.deactivation.describe()


def test_the_users_suspend_marks_the_workload_and_only_a_marked_one_is_activated_again() -> None:
    kube = FakeKube([wl()])
    assert workload.set_active(kube, RAYJOB, False).changed  # type: ignore[arg-type]
    assert kube.patched == [
        (
            "v1beta2/workloads",
            "rayjob-j-1a2b3",
            {"metadata": {"annotations": {SUSPENDED_BY_USER_ANNOTATION: "true"}}, "spec": {"active": False}},
        )
    ]
    kube = FakeKube([BY_US])
    synced = workload.set_active(kube, RAYJOB, True)  # type: ignore[arg-type]
    assert synced.changed and synced.deactivation is None
    assert kube.patched[0][2] == {
        "metadata": {"annotations": {SUSPENDED_BY_USER_ANNOTATION: None}},
        "spec": {"active": True},
    }
    # A user's suspend of a Workload Kueue already deactivated writes nothing, and so no mark that
    # a later resume would take for the operator's own.
    kube = FakeKube([MAX_TIME])
    assert not workload.set_active(kube, RAYJOB, False).changed  # type: ignore[arg-type]
    assert kube.patched == []


@pytest.mark.parametrize(
    ("group", "version"),
    [
        (GROUP_V1BETA2, "v1beta2"),
        (GROUP_V1BETA1, "v1beta1"),  # Kueue before v0.15
        ({**GROUP_V1BETA2, "preferredVersion": {"version": "v1"}}, "v1beta2"),  # a future preferred one
    ],
)
def test_the_workload_version_is_the_one_the_cluster_serves(group: dict[str, Any], version: str) -> None:
    kube = FakeKube([wl()], group)
    workload.set_active(kube, RAYJOB, False)  # type: ignore[arg-type]
    assert kube.listed == [f"kueue.x-k8s.io/{version}/workloads?kueue.x-k8s.io/job-uid=r-uid"]
    assert kube.patched[0][0] == f"{version}/workloads"
    workload.set_active(kube, RAYJOB, False)  # type: ignore[arg-type]
    assert kube.requests == ["/apis/kueue.x-k8s.io"], "discovered once"


def test_no_kueue_is_said_plainly_and_a_kueue_installed_later_is_found() -> None:
    kube = FakeKube([], group=None)
    with pytest.raises(workload.KueueUnavailable, match="Kueue is not installed"):
        workload.set_active(kube, RAYJOB, True)  # type: ignore[arg-type]
    with pytest.raises(workload.KueueUnavailable, match=r"serves kueue\.x-k8s\.io v1alpha9"):
        workload.pick_version(
            {"versions": [{"version": "v1alpha9"}], "preferredVersion": {"version": "v1alpha9"}}
        )
    kube.group = GROUP_V1BETA1
    assert not workload.set_active(kube, RAYJOB, True).changed  # type: ignore[arg-type]
    assert len(kube.requests) == 2, "a missing Kueue is not remembered"


def test_a_queued_job_without_kueue_says_so_and_backs_off() -> None:
    """Before, the reconcile raised a 5 s TemporaryError on every try, forever, and the job read
    "queued in Kueue LocalQueue" although no Kueue would ever admit it."""
    kube = FakeKube([], group=None)
    job = {
        "metadata": {"name": "j", "namespace": "n", "uid": "u", "generation": 1, "resourceVersion": "1"},
        "status": {"phase": "Pending", "message": "queued in Kueue LocalQueue 'q'"},
    }
    delays = []
    for retry in (0, 3, 10):
        with pytest.raises(kopf.TemporaryError) as caught:
            reconcile._sync_workload(
                kube,  # type: ignore[arg-type]
                job,
                RAYJOB,
                active=True,
                logger=logging.getLogger("test"),  # type: ignore[arg-type]
                retry=retry,
            )
        delays.append(caught.value.delay)
    assert delays == [5, 40, 300]
    status = kube.patched[0][2]["status"]
    assert status["message"].startswith(
        "waiting for Kueue (looked at again in 5 s or sooner): Kueue is not installed"
    )
    assert status["phase"] == "Pending"


def _job(status: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": "j", "namespace": "n", "uid": "u", "generation": 1, "resourceVersion": "1"}
    return {"metadata": meta, "spec": {"runPolicy": {}}, "status": status}


def test_the_mirror_fails_a_job_whose_workload_kueue_deactivated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kueue's eviction suspends the RayJob; the mirror reads the Workload and fails the job with
    Kueue's cause, instead of calling it queued. Later mirrors leave the failure alone."""
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:00:00Z")
    kube = FakeKube([REQUEUE_LIMIT])
    startup.mirror(kube, _job({"phase": "Running"}), RAYJOB)  # type: ignore[arg-type]
    status = next(body for _, _, body in reversed(kube.patched) if "status" in body)["status"]
    assert status["phase"] == "Failed"
    assert "RequeuingLimitExceeded" in status["message"], status
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == KUEUE_DEACTIVATED
    later = operator_status(_job(status), RAYJOB, Step.MIRRORED, "2026-11-26T10:00:09Z")
    assert later.update == {}, "the suspended RayJob's states are not the failed job's"


@pytest.mark.parametrize(
    ("stored", "status", "rayjob_annotations"),
    [
        ([BY_ADMIN], {"phase": "Pending"}, {}),  # not Kueue's verdict
        ([MAX_TIME], {"phase": "Succeeded"}, {}),  # a finished job stays finished: no read
        ([BY_US], {"phase": "Suspended"}, {SUSPENDED_BY_USER_ANNOTATION: "true"}),  # the user's: no read
    ],
)
def test_the_mirror_fails_no_job_for_anything_else(
    monkeypatch: pytest.MonkeyPatch,
    stored: list[dict[str, Any]],
    status: dict[str, Any],
    rayjob_annotations: dict[str, str],
) -> None:
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:00:00Z")
    kube = FakeKube(stored)
    ray = {**RAYJOB, "metadata": {**RAYJOB["metadata"], "annotations": rayjob_annotations}}  # type: ignore[dict-item]
    startup.mirror(kube, _job(status), ray)  # type: ignore[arg-type]
    assert all(body.get("status", {}).get("phase") != "Failed" for _, _, body in kube.patched), kube.patched
    if status["phase"] != "Pending":
        assert kube.listed == [], "no Workload read"


def _unqueued(suspend: bool, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": "j", "namespace": "n", "uid": "r-uid", "labels": {}, "annotations": annotations or {}}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": {"suspend": suspend}}


class ChildKube(FakeKube):
    """Stores what `ensure` creates as Kueue's webhook would under manageJobsWithoutQueueName:
    suspended."""

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "spec": {**obj["spec"], "suspend": True}}


def test_a_rayjob_kueue_suspended_at_creation_is_marked_and_its_suspend_left_to_kueue() -> None:
    from llmtrain.constants import KUEUE_MANAGED_ANNOTATION
    from llmtrain.operator.children import EnsureResult, drift_patch, ensure

    kube = ChildKube([])
    ensure(kube, _unqueued(False), EnsureResult(), None)  # type: ignore[arg-type]
    assert kube.patched == [
        ("v1/rayjobs", "j", {"metadata": {"annotations": {KUEUE_MANAGED_ANNOTATION: "true"}}})
    ]
    marked = _unqueued(True, {KUEUE_MANAGED_ANNOTATION: "true"})
    assert "spec" not in drift_patch(_unqueued(False), marked), "never un-suspended once marked"


def test_an_unmarked_rayjob_with_a_workload_is_kueues_and_one_without_is_the_operators() -> None:
    """An existing RayJob (e.g. made before the operator marked them): the Workload decides, read
    only when the operator would write `suspend`."""
    from llmtrain.constants import KUEUE_MANAGED_ANNOTATION
    from llmtrain.operator.children import EnsureResult, ensure

    asked: list[str] = []

    def manages(kube: FakeKube) -> Any:
        def check(rayjob: dict[str, Any]) -> bool:
            asked.append(rayjob["metadata"]["name"])
            return workload.manages(kube, rayjob)  # type: ignore[arg-type]

        return check

    kube = FakeKube([wl()])
    ensure(kube, _unqueued(False), EnsureResult(), _unqueued(True), None, manages(kube))  # type: ignore[arg-type]
    assert kube.patched == [
        ("v1/rayjobs", "j", {"metadata": {"annotations": {KUEUE_MANAGED_ANNOTATION: "true"}}})
    ]
    kube = FakeKube([])
    ensure(kube, _unqueued(False), EnsureResult(), _unqueued(True), None, manages(kube))  # type: ignore[arg-type]
    assert kube.patched == [("v1/rayjobs", "j", {"spec": {"suspend": False}})], "no Kueue: the user's resume"
    asked.clear()
    kube = FakeKube([wl()])
    ensure(kube, _unqueued(False), EnsureResult(), _unqueued(False), None, manages(kube))  # type: ignore[arg-type]
    assert asked == [] and kube.listed == [], "nothing to write: no Workload read"


def test_a_job_kueue_manages_without_a_queue_name_reads_queued() -> None:
    from llmtrain.constants import KUEUE_MANAGED_ANNOTATION
    from llmtrain.operator.status import derive

    ray = _unqueued(True, {KUEUE_MANAGED_ANNOTATION: "true"})
    ray["status"] = {"jobDeploymentStatus": "Suspended"}
    update, observed = derive(ray, {}, 1, "2026-11-26T10:00:00Z")
    assert (observed.phase, observed.reason) == ("Pending", "Queued")
    assert update["message"].startswith("queued in Kueue (it manages jobs without a queue name here)")
    ray["metadata"]["annotations"][SUSPENDED_BY_USER_ANNOTATION] = "true"
    _, held = derive(ray, {}, 1, "2026-11-26T10:00:00Z")
    assert held.phase == "Suspended" and held.message.startswith("suspended (runPolicy.suspend)")
