"""The pure RayJob → LLMTrainingJob status mapping and the child drift patch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llmtrain.operator.children import drift_patch
from llmtrain.operator.status import (
    CONDITION_TYPES,
    Announcement,
    Refused,
    Waiting,
    clear_invalid_spec,
    conditions_for,
    invalid_spec_conditions,
    mirrored_fields,
    observe,
    operator_status,
)

from tests.support.jobs import stored_reporter_rbac


@pytest.mark.parametrize(
    ("status", "phase", "reason", "message"),
    [
        (None, "Pending", "RayJobCreated", "RayJob created; waiting for KubeRay"),
        (
            {"jobDeploymentStatus": "Initializing"},
            "Initializing",
            "RayClusterStarting",
            "Ray cluster is starting",
        ),
        (
            {"jobDeploymentStatus": "Waiting"},
            "Initializing",
            "WaitingForSubmission",
            "waiting for the job submission",
        ),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, "Running", "Training", "training"),
        (
            {"jobDeploymentStatus": "Retrying", "failed": 1},
            "Initializing",
            "Retrying",
            "retrying on a new Ray cluster; training resumes from the latest checkpoint",
        ),
        (
            {"jobDeploymentStatus": "Suspending"},
            "Suspended",
            "Suspending",
            "suspending: the Ray cluster is being deleted, checkpoints are kept",
        ),
        (
            {"jobDeploymentStatus": "Suspended"},
            "Suspended",
            "Suspended",
            "suspended; set spec.runPolicy.suspend to false to resume from the latest checkpoint",
        ),
        (
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
            "Succeeded",
            "Completed",
            "training finished",
        ),
        (
            {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"},
            "Failed",
            "Stopped",
            "the Ray job was stopped before it finished",
        ),
        (
            {"jobDeploymentStatus": "Failed", "reason": "AppFailed", "jobStatus": "FAILED"},
            "Failed",
            "AppFailed",
            "the training application failed",
        ),
        (
            {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"},
            "Failed",
            "DeadlineExceeded",
            "spec.runPolicy.activeDeadlineSeconds exceeded",
        ),
        (
            {"jobDeploymentStatus": "Failed", "reason": "PreRunningDeadlineExceeded"},
            "Failed",
            "PreRunningDeadlineExceeded",
            "the Ray cluster did not start in time",
        ),
        (
            {"jobDeploymentStatus": "Failed", "reason": "SubmissionFailed"},
            "Failed",
            "SubmissionFailed",
            "the job could not be submitted to the Ray cluster",
        ),
        (
            {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed"},
            "Failed",
            "ValidationFailed",
            "KubeRay rejected the rendered RayJob",
        ),
        # kuberay#2314: jobStatus RUNNING beside a failed deployment: the deployment wins.
        (
            {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "jobStatus": "RUNNING"},
            "Failed",
            "DeadlineExceeded",
            "spec.runPolicy.activeDeadlineSeconds exceeded",
        ),
        # A state this operator does not know yet: Pending, and the reason names it.
        ({"jobDeploymentStatus": "Hibernating"}, "Pending", "UnknownHibernating", "UnknownHibernating"),
    ],
)
def test_phase_from_deployment_status_and_reason(
    status: dict | None, phase: str, reason: str, message: str
) -> None:
    observed = observe(status)
    assert (observed.phase, observed.reason, observed.message) == (phase, reason, message)


def test_failure_message_carries_kuberay_detail() -> None:
    observed = observe({"jobDeploymentStatus": "Failed", "reason": "AppFailed", "message": "exit code 1"})
    assert observed.message == "the training application failed: exit code 1"


def test_conditions_transition_times_move_only_on_flips() -> None:
    first = conditions_for("Initializing", "RayClusterStarting", "m", 1, [], "t1")
    assert [c["type"] for c in first] == list(CONDITION_TYPES)
    assert all(c["lastTransitionTime"] == "t1" and c["observedGeneration"] == 1 for c in first)
    second = conditions_for("Running", "Training", "training", 2, first, "t2")
    by_type = {c["type"]: c for c in second}
    assert by_type["Running"]["status"] == "True" and by_type["Running"]["lastTransitionTime"] == "t2"
    assert by_type["Running"]["reason"] == "Training"
    assert by_type["Created"]["lastTransitionTime"] == "t1"
    assert by_type["Succeeded"]["lastTransitionTime"] == "t1" and by_type["Succeeded"]["status"] == "False"
    assert all(c["observedGeneration"] == 2 for c in second)
    third = conditions_for("Running", "Training", "training", 2, second, "t3")
    assert third == second


def test_invalid_spec_then_fixed() -> None:
    bad = invalid_spec_conditions("invalid spec: x", 1, [], "t1")
    assert {c["type"]: c["status"] for c in bad} == {"InvalidSpec": "True", "Failed": "True"}
    again = invalid_spec_conditions("invalid spec: x", 2, bad, "t2")
    assert all(c["lastTransitionTime"] == "t1" for c in again)
    fixed = clear_invalid_spec(again, 3, "t3")
    inv = next(c for c in fixed if c["type"] == "InvalidSpec")
    assert inv["status"] == "False" and inv["lastTransitionTime"] == "t3" and inv["observedGeneration"] == 3


def test_mirrored_fields() -> None:
    rayjob = {
        "metadata": {"name": "j"},
        "status": {
            "rayClusterName": "j-abcde",
            "dashboardURL": "j-head-svc:8265",
            "startTime": "s",
            "endTime": "e",
            "failed": 2,
            "jobStatus": "RUNNING",
        },
    }
    assert mirrored_fields(rayjob) == {
        "rayJobName": "j",
        "rayClusterName": "j-abcde",
        "dashboardURL": "j-head-svc:8265",
        "startTime": "s",
        "completionTime": "e",
        "retries": 2,
    }


def test_retries_count_retries_not_failed_attempts() -> None:
    from llmtrain.operator.status import retries

    assert retries({}) == 0
    assert retries({"jobDeploymentStatus": "Retrying", "failed": 1}) == 1  # the first retry is running
    assert retries({"jobDeploymentStatus": "Complete", "failed": 1, "succeeded": 1}) == 1
    assert retries({"jobDeploymentStatus": "Failed", "failed": 2}) == 1  # maxRetries 1, both attempts failed
    assert retries({"jobDeploymentStatus": "Failed", "failed": 1}) == 0  # e.g. the deadline, never retried


def test_mirrored_fields_clear_what_the_rayjob_no_longer_has() -> None:
    suspended = {"metadata": {"name": "j"}, "status": {"jobDeploymentStatus": "Suspended"}}
    fields = mirrored_fields(suspended)
    assert fields["rayClusterName"] is None and fields["dashboardURL"] is None


def _cm(data: dict, labels: dict | None = None, owners: list | None = None) -> dict:
    meta: dict = {"name": "c", "namespace": "n", "labels": labels or {"a": "1"}}
    if owners is not None:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_drift_patch_adopts_and_resyncs_only_managed_fields() -> None:
    owner = [
        {
            "uid": "u1",
            "controller": True,
            "kind": "LLMTrainingJob",
            "name": "j",
            "apiVersion": "llmtrain.dev/v1alpha1",
        }
    ]
    desired = _role([{"verbs": ["patch"]}], owners=owner)
    assert drift_patch(desired, _role([{"verbs": ["patch"]}], owners=owner)) == {}
    orphan = _role([{"verbs": ["get"]}], labels={"a": "1", "extra": "kept"}, owners=[])
    patch = drift_patch(desired, orphan)
    assert patch == {"metadata": {"ownerReferences": owner}, "rules": [{"verbs": ["patch"]}]}


def test_the_trainer_config_map_is_never_rewritten() -> None:
    """Immutable: an operator that renders it differently (an upgrade) leaves a running job's be."""
    owner = [{"uid": "u1", "controller": True, "kind": "LLMTrainingJob", "name": "j"}]
    assert drift_patch(_cm({"k": "new"}, owners=owner), _cm({"k": "old"}, owners=owner)) == {}


def _role(rules: list, labels: dict | None = None, owners: list | None = None) -> dict:
    role = _cm({}, labels, owners)
    del role["data"]
    return {**role, "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": rules}


def test_drift_patch_rayjob_touches_only_mutable_fields() -> None:
    desired = {
        "kind": "RayJob",
        "metadata": {"labels": {}},
        "spec": {
            "suspend": True,
            "ttlSecondsAfterFinished": 10,
            "entrypoint": "new",
            "activeDeadlineSeconds": None,
        },
    }
    existing = {
        "kind": "RayJob",
        "metadata": {"labels": {}},
        "spec": {
            "suspend": False,
            "ttlSecondsAfterFinished": 10,
            "entrypoint": "old",
            "activeDeadlineSeconds": 60,
        },
    }
    assert drift_patch(desired, existing) == {"spec": {"suspend": True, "activeDeadlineSeconds": None}}


def test_drift_patch_takes_an_absent_suspend_for_false() -> None:
    """KubeRay's own updates omit `suspend: false`; that is not drift."""
    desired = {"kind": "RayJob", "metadata": {"labels": {}}, "spec": {"suspend": False}}
    assert drift_patch(desired, {"kind": "RayJob", "metadata": {"labels": {}}, "spec": {}}) == {}


def test_drift_patch_never_writes_suspend_of_a_queued_rayjob() -> None:
    """Kueue flips suspend on admission and preemption; the operator must not flip it back."""
    queued = {"labels": {"kueue.x-k8s.io/queue-name": "gpu"}}
    for want, have in ((True, False), (False, True)):
        desired = {
            "kind": "RayJob",
            "metadata": queued,
            "spec": {"suspend": want, "activeDeadlineSeconds": 60},
        }
        existing = {"kind": "RayJob", "metadata": queued, "spec": {"suspend": have}}
        assert drift_patch(desired, existing) == {"spec": {"activeDeadlineSeconds": 60}}


def test_a_user_suspend_of_a_queued_rayjob_marks_it_and_leaves_suspend_and_queue_to_kueue() -> None:
    """Suspended after it was queued: the desired RayJob has no queue label (render), but the stored
    one keeps it, so its `suspend` stays Kueue's; only the user's mark is written."""
    queued = {"labels": {"kueue.x-k8s.io/queue-name": "gpu"}}
    desired = {
        "kind": "RayJob",
        "metadata": {"labels": {}, "annotations": {"llmtrain.dev/suspended": "true"}},
        "spec": {"suspend": True},
    }
    existing = {"kind": "RayJob", "metadata": queued, "spec": {"suspend": False}}
    assert drift_patch(desired, existing) == {"metadata": {"annotations": {"llmtrain.dev/suspended": "true"}}}
    # Resumed: the mark goes (None removes it in a merge patch), suspend is still Kueue's.
    resumed = {"kind": "RayJob", "metadata": queued, "spec": {"suspend": False}}
    marked = {**existing, "metadata": {**queued, "annotations": {"llmtrain.dev/suspended": "true"}}}
    marked["spec"] = {"suspend": True}
    assert drift_patch(resumed, marked) == {"metadata": {"annotations": {"llmtrain.dev/suspended": None}}}
    # Created suspended, never queued: the operator owns suspend, and resuming gives it to Kueue.
    held = {"kind": "RayJob", "metadata": {"labels": {}}, "spec": {"suspend": True}}
    assert drift_patch(resumed, held) == {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu"}}}


def test_a_queued_job_its_user_suspended_says_so_and_names_its_queue() -> None:
    held = observe({"jobDeploymentStatus": "Suspended"}, queue="gpu-team", suspended_by_user=True)
    assert (held.phase, held.reason) == ("Suspended", "Suspended")
    assert held.message == (
        "suspended (runPolicy.suspend): its Kueue Workload is deactivated and holds no quota in "
        "LocalQueue 'gpu-team'; set runPolicy.suspend to false to queue it again"
    )


def test_root_cause_only_added_on_failure() -> None:
    from llmtrain.operator.status import with_root_cause

    failed = observe({"jobDeploymentStatus": "Failed", "reason": "AppFailed"})
    assert with_root_cause(failed, {"error": "NCCL timeout on rank 1"}).message.endswith(
        "trainer reported: NCCL timeout on rank 1"
    )
    running = observe({"jobDeploymentStatus": "Running"})
    assert with_root_cause(running, {"error": "x"}) == running
    assert with_root_cause(failed, None) == failed


def test_a_child_of_an_earlier_namesake_is_waited_for_and_a_foreign_one_is_a_conflict() -> None:
    import pytest
    from llmtrain.operator.children import ChildBeingReplaced, OwnershipConflict, ensure_all
    from llmtrain.operator.kube import ApiError

    def ref(uid: str, name: str = "j", kind: str = "LLMTrainingJob") -> dict:
        return {
            "apiVersion": "llmtrain.dev/v1alpha1",
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": True,
        }

    class Kube:
        def __init__(self, existing: dict) -> None:
            self.existing = existing

        def create(self, obj: dict) -> dict:
            raise ApiError(409, "AlreadyExists", "exists")

        def get(self, resource: object, namespace: str, name: str) -> dict:
            return self.existing

    desired = _cm({"k": "v"}, owners=[ref("new")])
    for existing_owner, error in (
        (ref("old"), ChildBeingReplaced),  # the deleted job of the same name
        (ref("other", name="k"), OwnershipConflict),  # another job's child
        (ref("x", kind="Deployment", name="j"), OwnershipConflict),  # not a job of ours at all
    ):
        with pytest.raises(error):
            ensure_all(Kube(_cm({"k": "v"}, owners=[existing_owner])), [desired])  # type: ignore[arg-type]
    dying = _cm({"k": "v"}, owners=[ref("other", name="k")])
    dying["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    with pytest.raises(ChildBeingReplaced):
        ensure_all(Kube(dying), [desired])  # type: ignore[arg-type]


def test_a_retained_claim_is_checked_by_its_uid_label_and_reused_by_a_namesake() -> None:
    """storage.create.reclaim Retain renders the claim without an owner reference. It is still
    checked as the job's own: a retained claim of an earlier job of the name (our marks) is reused
    and relabelled, never given an owner; a hand-made one, or one another object controls, is a
    conflict; one the deleted namesake still controls is waited for."""
    import pytest
    from llmtrain.constants import JOB_UID_LABEL
    from llmtrain.operator.children import ChildBeingReplaced, EnsureResult, OwnershipConflict, ensure

    marks = {"app.kubernetes.io/managed-by": "llmtrain-operator", "llmtrain.dev/job": "j"}

    def claim(uid: str, owners: list[dict] | None = None, labels: dict | None = None) -> dict:
        meta: dict = {
            "name": "j-storage",
            "namespace": "n",
            "labels": labels or {**marks, JOB_UID_LABEL: uid},
        }
        if owners is not None:
            meta["ownerReferences"] = owners
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": {}}

    def ref(uid: str, name: str = "j") -> dict:
        return {
            "apiVersion": "llmtrain.dev/v1alpha1",
            "kind": "LLMTrainingJob",
            "name": name,
            "uid": uid,
            "controller": True,
        }

    class Kube:
        def __init__(self) -> None:
            self.patches: list[dict] = []

        def merge_patch(self, resource: object, namespace: str, name: str, patch: dict) -> dict:
            self.patches.append(patch)
            return patch

    desired = claim("new")
    kube = Kube()
    ensure(kube, desired, EnsureResult(), claim("old"))  # type: ignore[arg-type]
    assert kube.patches == [{"metadata": {"labels": {JOB_UID_LABEL: "new"}}}]
    # This job's own claim, owned as an operator before `reclaim` made it: the owner goes, so
    # the garbage collector keeps the claim when the job is deleted; anyone else's reference stays.
    kube = Kube()
    ensure(kube, desired, EnsureResult(), claim("new", owners=[ref("new")]))  # type: ignore[arg-type]
    assert kube.patches == [{"metadata": {"ownerReferences": None}}]
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm"}
    kube = Kube()
    ensure(kube, desired, EnsureResult(), claim("new", owners=[other, ref("new")]))  # type: ignore[arg-type]
    assert kube.patches == [{"metadata": {"ownerReferences": [other]}}]
    for existing, error in (
        (claim("", labels={"a": "1"}), OwnershipConflict),  # the user's own claim of that name
        (claim("x", owners=[ref("x", name="k")]), OwnershipConflict),  # another job's
        (claim("old", owners=[ref("old")]), ChildBeingReplaced),  # the deleted namesake's, going
    ):
        with pytest.raises(error):
            ensure(Kube(), desired, EnsureResult(), existing)  # type: ignore[arg-type]


def test_a_suspended_queued_rayjob_is_queued_not_suspended() -> None:
    """Kueue owns a queued RayJob's suspend: it waits for admission, the user did nothing."""
    queued = observe({"jobDeploymentStatus": "Suspended"}, queue="gpu-team")
    assert (queued.phase, queued.reason) == ("Pending", "Queued")
    assert queued.message == (
        "queued in Kueue LocalQueue 'gpu-team': waiting for quota to admit it (a preempted job waits "
        "here too, and resumes from its latest checkpoint)"
    )
    running = observe({"jobDeploymentStatus": "Running"}, queue="gpu-team")
    assert running.phase == "Running"


def test_a_retry_keeps_the_cause_kuberay_reported() -> None:
    retry = observe({"jobDeploymentStatus": "Retrying", "message": "submitter exited with code 1"})
    assert retry.phase == "Initializing"
    assert retry.message == (
        "retrying on a new Ray cluster; training resumes from the latest checkpoint "
        "(after: submitter exited with code 1)"
    )


def test_derive_reads_the_queue_from_the_rayjob_and_the_root_cause_from_progress() -> None:
    from llmtrain.operator.status import derive

    rayjob = {
        "metadata": {"name": "j", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
        "status": {"jobDeploymentStatus": "Suspended"},
    }
    update, observed = derive(rayjob, {}, 3, "t")
    assert update["phase"] == "Pending" and observed.reason == "Queued" and update["observedGeneration"] == 3
    failed = {"metadata": {"name": "j"}, "status": {"jobDeploymentStatus": "Failed", "reason": "AppFailed"}}
    update, _ = derive(failed, {"progress": {"error": "OOM on rank 1"}}, 1, "t")
    assert update["message"].endswith("trainer reported: OOM on rank 1")


def test_an_unmarked_object_without_a_controller_is_never_adopted() -> None:
    from llmtrain.operator.children import OwnershipConflict, ensure_all
    from llmtrain.operator.kube import ApiError

    class Kube:
        def __init__(self, existing: dict) -> None:
            self.existing, self.patched = existing, False

        def create(self, obj: dict) -> dict:
            raise ApiError(409, "AlreadyExists", "exists")

        def get(self, resource: object, namespace: str, name: str) -> dict:
            return self.existing

        def merge_patch(self, *args: object) -> dict:
            self.patched = True
            return self.existing

    owner = [{"uid": "u1", "controller": True, "kind": "LLMTrainingJob", "name": "j"}]
    marks = {"app.kubernetes.io/managed-by": "llmtrain-operator", "llmtrain.dev/job": "j"}
    desired = _cm({"k": "v"}, labels=marks, owners=owner)
    users = Kube(_cm({"k": "mine"}, labels={"team": "a"}, owners=[]))
    with pytest.raises(OwnershipConflict, match="was not created by llmtrain"):
        ensure_all(users, [desired])  # type: ignore[arg-type]
    assert not users.patched
    # Ours but without an owner reference: only a claim is given one (that needs `delete` on it
    # under OwnerReferencesPermissionEnforcement, granted on claims alone); anything else is named.
    ours = Kube(_cm({"k": "old"}, labels=marks, owners=[]))
    with pytest.raises(OwnershipConflict, match="kubectl delete configmaps c -n"):
        ensure_all(ours, [desired])  # type: ignore[arg-type]
    assert not ours.patched
    claim = Kube({**_cm({}, labels=marks, owners=[]), "kind": "PersistentVolumeClaim"})
    result = ensure_all(claim, [{**desired, "kind": "PersistentVolumeClaim"}])  # type: ignore[arg-type]
    assert claim.patched and result.adopted == ["PersistentVolumeClaim/c"]


class _Store:
    """A fake API holding objects by name: creates refused with `refuse` (e.g. a full quota's 403)."""

    def __init__(self, objects: list[dict], refuse: int | None = None) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.refuse = refuse
        self.creates: list[str] = []
        self.patches: list[tuple[str, dict]] = []

    def get(self, resource: object, namespace: str, name: str) -> dict:
        from llmtrain.operator.kube import ApiError

        if name not in self.objects:
            raise ApiError(404, "NotFound", name)
        return self.objects[name]

    def create(self, obj: dict) -> dict:
        from llmtrain.operator.kube import ApiError

        self.creates.append(obj["metadata"]["name"])
        if self.refuse:
            raise ApiError(self.refuse, "Forbidden", "exceeded quota")
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    def merge_patch(self, resource: object, namespace: str, name: str, patch: dict) -> dict:
        self.patches.append((name, patch))
        return self.objects[name]


def test_children_are_read_before_created_so_a_full_quota_never_refuses_what_exists() -> None:
    """At its ResourceQuota, the API server answers a create of an existing object with 403, not 409."""
    import pytest
    from llmtrain.operator.children import ensure_all
    from llmtrain.operator.kube import ApiError

    owner = [{"uid": "u1", "controller": True, "kind": "LLMTrainingJob", "name": "j"}]
    existing = _cm({"k": "v"}, owners=owner)
    full = _Store([existing], refuse=403)
    assert ensure_all(full, [_cm({"k": "v"}, owners=owner)]).created == []  # type: ignore[arg-type]
    assert full.creates == []
    empty = _Store([], refuse=403)
    with pytest.raises(ApiError) as refused:
        ensure_all(empty, [_cm({"k": "v"}, owners=owner)])  # type: ignore[arg-type]
    assert refused.value.status == 403 and empty.creates == ["c"]


def test_children_an_earlier_job_of_the_name_left_are_named_and_never_reused() -> None:
    """After `kubectl delete --cascade=orphan` and a re-apply (a new uid), the old config, identity
    and RayJob are never adopted: the job names them and the command that deletes them, creates and
    changes nothing; the claim (the data orphaning keeps) is adopted and stamped with the new uid."""
    import pytest
    from llmtrain.operator.children import LeftByEarlierJob, ensure_all

    def child(kind: str, name: str, uid: str, owners: list[dict]) -> dict:
        marks = {"app.kubernetes.io/managed-by": "llmtrain-operator", "llmtrain.dev/job": "j"}
        obj = _cm({}, labels={**marks, "llmtrain.dev/job-uid": uid}, owners=owners)
        obj["kind"], obj["metadata"]["name"] = kind, name
        return obj

    new = [{"uid": "u2", "controller": True, "kind": "LLMTrainingJob", "name": "j"}]
    desired = [
        child("PersistentVolumeClaim", "j-storage", "u2", new),
        child("ConfigMap", "j-config", "u2", new),
    ]
    old = _Store(
        [child("PersistentVolumeClaim", "j-storage", "u1", []), child("ConfigMap", "j-config", "u1", [])]
    )
    with pytest.raises(LeftByEarlierJob) as left:
        ensure_all(old, desired)  # type: ignore[arg-type]
    assert "ConfigMap/j-config" in str(left.value) and "PersistentVolumeClaim" not in str(left.value)
    assert "kubectl delete configmaps -n" in str(left.value) and "llmtrain.dev/job-uid!=u2" in str(left.value)
    assert old.creates == [] and old.patches == []
    claim_only = _Store([child("PersistentVolumeClaim", "j-storage", "u1", [])])
    result = ensure_all(claim_only, desired)  # type: ignore[arg-type]
    assert result.adopted == ["PersistentVolumeClaim/j-storage"] and result.created == ["ConfigMap/j-config"]
    ((claim, patch),) = claim_only.patches
    assert claim == "j-storage"
    assert patch["metadata"]["labels"] == {"llmtrain.dev/job-uid": "u2"}
    assert patch["metadata"]["ownerReferences"] == new


def test_a_resume_or_retry_does_not_flash_back_to_created() -> None:
    """KubeRay's RayJob passes through New again on resume and after a retry's clean-up."""
    from llmtrain.operator.status import derive

    new = {"metadata": {"name": "j"}, "status": {"jobDeploymentStatus": "New"}}
    for before in ("Suspended", "Running", "Initializing"):
        update, observed = derive(new, {"phase": before}, 2, "t")
        assert (update["phase"], observed.reason) == ("Initializing", "Resuming"), before
        assert update["message"] == "starting a new Ray cluster; training resumes from the latest checkpoint"
    update, observed = derive(new, {"phase": "Pending"}, 1, "t")
    assert (update["phase"], observed.reason) == ("Pending", "RayJobCreated")


def test_a_finished_job_is_never_mirrored_back_to_a_phase_under_way() -> None:
    """A RayJob without a terminal status (stored again without one, or suspended after the end)
    must not turn a finished job Pending, Running or Suspended: the reconciler would run it again.
    An end the RayJob still shows is mirrored (its fields, the root cause)."""
    from llmtrain.operator.status import Step, operator_status

    for phase in ("Succeeded", "Failed"):
        job = {"metadata": {"name": "j", "generation": 1}, "status": {"phase": phase, "rayJobName": "j"}}
        for rayjob_status in (
            {},
            {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
            {"jobDeploymentStatus": "Suspended"},
        ):
            rayjob = {"metadata": {"name": "j"}, "status": rayjob_status}
            said = operator_status(job, rayjob, Step.MIRRORED, "t")
            assert said.update == {} and said.event is None, (phase, rayjob_status, said)
    done = {
        "metadata": {"name": "j"},
        "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
    }
    job = {"metadata": {"name": "j", "generation": 1}, "status": {"phase": "Succeeded", "rayJobName": "j"}}
    assert operator_status(job, done, Step.MIRRORED, "t").update["phase"] == "Succeeded"


def test_one_jobs_conflict_does_not_end_the_resync_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resync loop goes on to the next job when one job's RayJob cannot be created again."""
    import logging

    from llmtrain.operator import mirror
    from llmtrain.operator.children import OwnershipConflict
    from llmtrain.operator.config import OperatorConfig

    def job(name: str) -> dict:
        meta = {"name": name, "namespace": "n", "uid": f"u-{name}"}
        return {"metadata": meta, "status": {"phase": "Running", "rayJobName": name}}

    rayjob_b = {"metadata": {"name": "b", "namespace": "n", "ownerReferences": []}}

    class Kube:
        def list_pages(
            self, resource: object, namespace: object, label_selector: object = None, **_: object
        ) -> Iterator[list]:
            if label_selector == mirror.UNFINISHED:  # none labelled finished
                yield self.list_all(resource, namespace)

        def list_all(self, resource: object, namespace: object, label_selector: object = None) -> list:
            return [job("a"), job("b")] if resource is mirror.JOB_RESOURCE else [rayjob_b]

        def get(self, resource: object, namespace: str, name: str) -> dict | None:
            return stored_reporter_rbac(resource, namespace, name)  # the reporter rights are in place

    def gone(*args: object) -> None:
        raise OwnershipConflict("a's RayJob name is taken")

    mirrored: list[str] = []
    monkeypatch.setattr(mirror, "rayjob_gone", gone)
    monkeypatch.setattr(mirror, "owner_ref", lambda rayjob: {"uid": "u-b"})
    monkeypatch.setattr(mirror.startup, "mirror", lambda kube, j, r: mirrored.append(j["metadata"]["name"]))
    mirror.resync_all(Kube(), OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert mirrored == ["b"]


def test_the_resync_pass_takes_jobs_no_longer_listed_off_the_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose DELETED event was missed leaves the gauge at the next pass; listed ones stay,
    unfinished ones from the pass's list, finished ones from its count of those labelled so."""
    import logging

    from llmtrain.operator import metrics, mirror
    from llmtrain.operator.config import OperatorConfig

    book = metrics.PhaseBook()
    book.set("n/kept", "Pending")
    book.set("n/gone", "Running")
    book.set("n/done", "Succeeded")
    book.set("n/done-gone", "Failed")
    kept = {"metadata": {"name": "kept", "namespace": "n", "uid": "u"}, "status": {"phase": "Pending"}}
    done = {"metadata": {"name": "done", "namespace": "n", "uid": "d"}, "status": {"phase": "Succeeded"}}

    class Kube:
        def list_pages(
            self, resource: object, namespace: object, label_selector: object = None, **_: object
        ) -> Iterator[list]:
            yield self.list_all(resource, namespace) if label_selector == mirror.UNFINISHED else [done]

        def list_all(self, resource: object, namespace: object, label_selector: object = None) -> list:
            return [kept] if resource is mirror.JOB_RESOURCE else []

    monkeypatch.setattr(mirror, "PHASE_BOOK", book)
    mirror.resync_all(Kube(), OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert book.keys() == {"n/kept", "n/done"}
    assert metrics.JOBS.labels(phase="Running")._value.get() == 0
    assert metrics.JOBS.labels(phase="Succeeded")._value.get() == 1
    assert metrics.JOBS.labels(phase="Failed")._value.get() == 0


def test_a_resync_pass_on_a_stale_list_neither_writes_nor_creates_for_a_job_finished_since() -> None:
    """The pass listed the job Running and then no RayJob (KubeRay deleted it after it finished):
    it reads the job again before acting, and its writes are conditional on the listed version."""
    import logging

    from llmtrain.operator import mirror
    from llmtrain.operator.config import OperatorConfig
    from llmtrain.operator.kube import ApiError

    from tests.support.jobs import minimal_job

    meta = {"name": "j", "namespace": "n", "uid": "u", "resourceVersion": "5", "generation": 1}
    listed = {**minimal_job("j", "n"), "metadata": meta, "status": {"phase": "Running", "rayJobName": "j"}}
    now = {**listed, "metadata": {**meta, "resourceVersion": "9"}, "status": {"phase": "Succeeded"}}

    class Kube:
        def __init__(self) -> None:
            self.writes: list[object] = []

        def list_pages(
            self, resource: object, namespace: object, label_selector: object = None, **_: object
        ) -> Iterator[list]:
            if label_selector == mirror.UNFINISHED:  # none labelled finished
                yield self.list_all(resource, namespace)

        def list_all(self, resource: object, namespace: object, label_selector: object = None) -> list:
            return [listed] if resource is mirror.JOB_RESOURCE else []

        def get(self, resource: object, namespace: str, name: str) -> dict:
            if resource is mirror.JOB_RESOURCE:
                return now
            if reporter := stored_reporter_rbac(resource, namespace, name):
                return reporter  # the namespace's reporter rights are in place
            raise ApiError(404, "NotFound", name)

        def create(self, obj: dict) -> dict:
            self.writes.append(("create", obj["kind"]))
            return obj

        def merge_patch(self, *args: object, **kwargs: object) -> dict:
            self.writes.append(("patch", args))
            return {}

    kube = Kube()
    mirror.resync_all(kube, OperatorConfig(), logging.getLogger("test"))  # type: ignore[arg-type]
    assert kube.writes == []


def test_the_job_locks_serialize_one_job_and_are_dropped_when_free() -> None:
    import threading

    from llmtrain.operator.serial import JobLocks

    locks, order = JobLocks(), []

    def second() -> None:
        with locks.hold("n/a"):
            order.append("other")

    with locks.hold("n/a"):
        other = threading.Thread(target=second)
        other.start()
        with locks.hold("n/b"):  # another job is not held up
            order.append("b")
        other.join(0.2)
        assert order == ["b"] and other.is_alive()
        order.append("first")
    other.join(2)
    assert order == ["b", "first", "other"]
    assert len(locks) == 0  # no lock kept for a job nobody works on


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_job_is_finished_for_good(phase: str) -> None:
    """Both ends are terminal: a Failed job's RayJob is never created again (its training would run
    again on GPUs); only a Failed for an invalid spec is judged again on the next edit."""
    from llmtrain.operator.status import finished

    assert finished({"phase": phase})
    assert not finished({"phase": "Running"}) and not finished({"phase": "Suspended"})
    invalid = {"phase": "Failed", "conditions": [{"type": "InvalidSpec", "status": "True"}]}
    assert not finished(invalid)


def test_a_queued_rayjob_its_user_suspended_is_suspended_not_queued() -> None:
    """derive reads the user's suspend from the RayJob's annotation (set by the operator)."""
    from llmtrain.constants import KUEUE_QUEUE_LABEL, SUSPENDED_BY_USER_ANNOTATION
    from llmtrain.operator.status import derive

    rayjob = {
        "metadata": {
            "name": "j",
            "labels": {KUEUE_QUEUE_LABEL: "q"},
            "annotations": {SUSPENDED_BY_USER_ANNOTATION: "true"},
        },
        "status": {"jobDeploymentStatus": "Suspended"},
    }
    update, observed = derive(rayjob, {}, 1, "t")
    assert (update["phase"], observed.reason) == ("Suspended", "Suspended")
    rayjob["metadata"]["annotations"] = {SUSPENDED_BY_USER_ANNOTATION: "false"}
    assert derive(rayjob, {}, 1, "t")[0]["phase"] == "Pending"


def test_derive_writes_the_observed_phase_reason_and_message_into_the_conditions() -> None:
    from llmtrain.operator.status import derive

    update, _ = derive({"metadata": {"name": "j"}, "status": {"jobDeploymentStatus": "Running"}}, {}, 1, "t")
    running = next(c for c in update["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"], running["message"]) == ("True", "Training", "training")


@pytest.mark.parametrize("phase", ["Pending", "Initializing", "Running", "Succeeded", "Failed", "Suspended"])
def test_each_phase_sets_its_own_condition_and_created_only(phase: str) -> None:
    """Created is always True (reason RayJobCreated, no message); the phase's own condition carries
    the reason and message; every other one is False with Not<Type> and no message."""
    conditions = {c["type"]: c for c in conditions_for(phase, "R", "what happened", None, [], "t")}  # type: ignore[arg-type]
    assert conditions["Created"] == {
        "type": "Created",
        "status": "True",
        "reason": "RayJobCreated",
        "message": "",
        "lastTransitionTime": "t",
    }
    for ctype in CONDITION_TYPES[1:]:
        if ctype == phase:
            assert (conditions[ctype]["status"], conditions[ctype]["reason"]) == ("True", "R")
            assert conditions[ctype]["message"] == "what happened"
        else:
            assert conditions[ctype]["status"] == "False", ctype
            assert (conditions[ctype]["reason"], conditions[ctype]["message"]) == (f"Not{ctype}", "")


def test_a_condition_written_without_a_transition_time_gets_one() -> None:
    """lastTransitionTime is required by the API: an unchanged condition that lacks it gets now."""
    existing = [{"type": "Running", "status": "True", "reason": "Training"}]
    running = next(
        c for c in conditions_for("Running", "Training", "m", 1, existing, "t2") if c["type"] == "Running"
    )
    assert running["lastTransitionTime"] == "t2"


def test_an_invalid_spec_again_keeps_one_condition_of_each_type() -> None:
    bad = invalid_spec_conditions("invalid spec: x", 1, [], "t1")
    again = invalid_spec_conditions("invalid spec: y", 2, bad, "t2")
    assert sorted(c["type"] for c in again) == ["Failed", "InvalidSpec"]
    assert all(c["message"] == "invalid spec: y" for c in again)


def test_clearing_an_invalid_spec_touches_no_other_true_condition() -> None:
    running = {"type": "Running", "status": "True", "reason": "Training", "message": "m"}
    invalid = {"type": "InvalidSpec", "status": "True", "reason": "InvalidSpec", "message": "x"}
    cleared = clear_invalid_spec([running, invalid], 2, "t")
    assert cleared[0] == running and cleared[1]["status"] == "False"


def test_a_failed_job_with_true_conditions_but_no_invalid_spec_is_finished() -> None:
    from llmtrain.operator.status import finished

    failed = {"type": "Failed", "status": "True", "reason": "AppFailed"}
    assert finished({"phase": "Failed", "conditions": [failed]})


@pytest.mark.parametrize(
    ("deployment", "ended_"),
    [("Complete", True), ("Failed", True), ("ValidationFailed", True), ("Running", False), ("New", False)],
)
def test_a_rayjob_ends_only_when_it_succeeded_or_failed(deployment: str, ended_: bool) -> None:
    from llmtrain.operator.status import ended

    assert ended({"metadata": {"name": "j"}, "status": {"jobDeploymentStatus": deployment}}) is ended_
    assert not ended({"metadata": {"name": "j"}})


def test_kuberays_reason_names_a_failure_only() -> None:
    """A ValidationFailed RayJob's reason is KubeRay's; a running one's stays ours."""
    rejected = observe({"jobDeploymentStatus": "ValidationFailed", "reason": "InvalidRayJobSpec"})
    assert (rejected.phase, rejected.reason) == ("Failed", "InvalidRayJobSpec")
    running = observe({"jobDeploymentStatus": "Running", "reason": "SomethingElse"})
    assert (running.phase, running.reason) == ("Running", "Training")


@pytest.mark.parametrize(
    ("outcome", "reason", "said"),
    [
        (
            Refused("exceeded quota: pvc", 5.0),
            "CreateRefused",
            "cannot create the job's objects yet (retrying every 5 s or sooner): exceeded quota: pvc",
        ),
        (
            Waiting("the cluster serves no Kueue Workload API", 30.0),
            "KueueUnavailable",
            "waiting for Kueue (looked at again in 30 s or sooner): the cluster serves no Kueue Workload API",
        ),
    ],
)
def test_a_refusal_or_a_wait_for_kueue_warns_once_per_problem_and_keeps_the_phase(
    outcome: Refused | Waiting, reason: str, said: str
) -> None:
    """The status says what holds the job back (Pending when it had no phase yet); the Warning goes
    out with the write that first says it, and afterwards only with a phase change, so a retry
    every few seconds does not post an Event each time."""
    now = "2026-11-27T00:00:00Z"
    first = operator_status({"metadata": {"generation": 3}, "status": {}}, None, outcome, now)
    assert first.update == {"phase": "Pending", "message": said, "observedGeneration": 3}
    assert first.event == Announcement("Warning", reason, said)
    assert first.announce == "write"
    known = {"phase": "Initializing", "message": said}
    again = operator_status({"metadata": {"generation": 3}, "status": known}, None, outcome, now)
    assert again.update == {"phase": "Initializing", "message": said, "observedGeneration": 3}
    assert again.event == first.event
    assert again.announce == "phase"
    other = {"phase": "Initializing", "message": "waiting for something else"}
    changed = operator_status({"metadata": {"generation": 3}, "status": other}, None, outcome, now)
    assert changed.announce == "write"


@pytest.mark.parametrize(
    ("condition", "kept"),
    [
        ({"type": "Failed", "status": "True", "reason": "AuthUnsupported"}, True),
        ({"type": "Failed", "status": "True", "reason": "KueueDeactivated"}, True),
        ({"type": "Failed", "status": "True", "reason": "AppFailed"}, False),
        ({"type": "Failed", "status": "False", "reason": "AuthUnsupported"}, False),
        ({"type": "Running", "status": "True", "reason": "AuthUnsupported"}, False),
    ],
)
def test_a_job_the_operator_failed_keeps_its_failure_when_its_stopped_rayjob_ends(
    condition: dict, kept: bool
) -> None:
    """Failed by the operator (no Ray auth, or Kueue deactivated its Workload), the job keeps its own
    message when the RayJob it stopped ends as stopped; a failure of the RayJob's own is mirrored."""
    from llmtrain.operator.status import Step

    job = {
        "metadata": {"name": "j", "generation": 1},
        "status": {"phase": "Failed", "message": "the operator's words", "conditions": [condition]},
    }
    stopped = {
        "metadata": {"name": "j"},
        "status": {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"},
    }
    said = operator_status(job, stopped, Step.MIRRORED, "t")
    if kept:
        assert said.update == {} and said.event is None
    else:
        assert (said.update["phase"], said.update["message"]) == (
            "Failed",
            "the Ray job was stopped before it finished",
        )


def test_a_rayjob_kueue_manages_without_a_queue_name_is_queued_in_kueue() -> None:
    """The operator marks a RayJob that Kueue manages without a queue label (manageJobsWithoutQueueName):
    suspended, it waits for Kueue's admission, and the message cannot name a LocalQueue."""
    from llmtrain.constants import KUEUE_MANAGED_ANNOTATION, KUEUE_QUEUE_LABEL
    from llmtrain.operator.status import derive

    managed = {
        "metadata": {"name": "j", "annotations": {KUEUE_MANAGED_ANNOTATION: "true"}},
        "status": {"jobDeploymentStatus": "Suspended"},
    }
    update, observed = derive(managed, {}, 1, "t")
    assert (update["phase"], observed.reason) == ("Pending", "Queued")
    assert update["message"] == (
        "queued in Kueue (it manages jobs without a queue name here): waiting for quota to admit it (a "
        "preempted job waits here too, and resumes from its latest checkpoint)"
    )
    labelled = {**managed, "metadata": {**managed["metadata"], "labels": {KUEUE_QUEUE_LABEL: "q"}}}
    assert derive(labelled, {}, 1, "t")[0]["message"].startswith("queued in Kueue LocalQueue 'q':")
    unmanaged = {**managed, "metadata": {"name": "j", "annotations": {KUEUE_MANAGED_ANNOTATION: "false"}}}
    assert derive(unmanaged, {}, 1, "t")[0]["phase"] == "Suspended"
    held = observe({"jobDeploymentStatus": "Suspended"}, queue="", suspended_by_user=True)
    assert held.message == (
        "suspended (runPolicy.suspend): its Kueue Workload is deactivated and holds no quota in "
        "Kueue (it manages jobs without a queue name here); set runPolicy.suspend to false to queue it again"
    )
