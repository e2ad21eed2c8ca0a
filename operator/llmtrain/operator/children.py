"""Create-or-adopt the rendered children, idempotently.

Kopf re-runs an interrupted handler after a restart, so every step must tolerate objects that
already exist: a child under its deterministic name is re-synced (its operator-managed fields
patched back to the rendered state), never duplicated. An existing object without a controller is
adopted only when it carries our marks (created by this operator for a job of this name) and this
job's uid; one an earlier job of this name left behind (`kubectl delete --cascade=orphan`) is never
reused, except its claim (the data orphaning keeps). Anything else under that name belongs to
someone else and is a conflict: never overwritten, never given an owner reference (which would let
the garbage collector delete it with the job).

Every child is read before it is created (a create of an object that exists fails with 403 in a
namespace at its ResourceQuota, not with 409), except on a job's first try (`create_first`): its
children do not exist yet, so each is created without a read, and the first create that conflicts
or is refused turns the rest back to reading first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmtrain.constants import (
    GROUP_VERSION,
    JOB_LABEL,
    JOB_UID_LABEL,
    KIND,
    KUEUE_MANAGED_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    MANAGED_BY_LABEL,
    OPERATOR_NAME,
    SUSPENDED_BY_USER_ANNOTATION,
)
from llmtrain.operator.kube import RESOURCES, ApiError, Kube, resource_of

# Fields the operator keeps in sync on an existing child. Everything else is create-only:
# KubeRay ignores later rayClusterSpec edits, PVC specs are immutable, and so is the trainer's
# ConfigMap (a running job's config never changes under it).
_SYNCED_FIELDS: dict[str, tuple[str, ...]] = {
    "ConfigMap": (),
    "Role": ("rules",),
    "RoleBinding": ("subjects",),
    "ServiceAccount": (),
    "PersistentVolumeClaim": (),
}
# How kubectl names each child's kind (in the command a LeftByEarlierJob message gives).
_PLURALS = {
    "ConfigMap": "configmaps",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ServiceAccount": "serviceaccounts",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "RayJob": "rayjobs",
}
PODS = RESOURCES[("v1", "Pod")]
# The only kind whose existing objects the operator gives an owner reference: the claim, whose data
# `kubectl delete --cascade=orphan` keeps for a later job of the name. Changing an object's owner
# references needs `delete` on it under OwnerReferencesPermissionEnforcement (permissions.ADOPT), a
# right granted on claims alone.
ADOPTED_KINDS = ("PersistentVolumeClaim",)
# The RayJob spec fields that may change after creation (see the CRD's immutability rules).
RAYJOB_MUTABLE = (
    "suspend",
    "ttlSecondsAfterFinished",
    "activeDeadlineSeconds",
    "preRunningDeadlineSeconds",
)


def kueue_owns_suspend(rayjob: Mapping[str, Any]) -> bool:
    """Queued in a LocalQueue (its label), or found managed by Kueue without one (our mark)."""
    meta = rayjob.get("metadata") or {}
    return (
        KUEUE_QUEUE_LABEL in (meta.get("labels") or {})
        or (meta.get("annotations") or {}).get(KUEUE_MANAGED_ANNOTATION) == "true"
    )


def rayjob_synced_fields(
    desired: dict[str, Any], existing: dict[str, Any], kueue_managed: bool = False
) -> tuple[str, ...]:
    """Kueue owns `suspend` of a RayJob it manages: its webhook suspends it at creation and its
    controller un-suspends it on admission and suspends it on preemption. Writing it back would
    start a job outside its quota, so once a RayJob is queued (or is being queued now), or Kueue
    manages it without a queue label (`kueue_managed`, or our mark), the operator never touches it."""
    queued = kueue_managed or kueue_owns_suspend(desired) or kueue_owns_suspend(existing)
    if queued or auth_dropped(desired, existing):
        # A RayJob stored without its auth was suspended on purpose (AuthDropped): never resumed.
        return tuple(name for name in RAYJOB_MUTABLE if name != "suspend")
    return RAYJOB_MUTABLE


def auth_dropped(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """The RayJob was rendered with Ray token authentication but stored without it: the installed
    RayJob CRD predates `authOptions` (KubeRay v1.5.1), and the API server prunes the fields a
    CRD does not declare, without an error."""
    want = desired.get("spec", {}).get("rayClusterSpec", {}).get("authOptions")
    have = (stored.get("spec") or {}).get("rayClusterSpec", {}).get("authOptions") or {}
    return bool(want) and have.get("mode") != want.get("mode")


class AuthDropped(Exception):
    """The job's RayJob would run with Ray's dashboard and job API open (see `auth_dropped`)."""

    def __init__(self, message: str, rayjob: dict[str, Any]) -> None:
        super().__init__(message)
        self.rayjob = rayjob


class OwnershipConflict(Exception):
    """A child's name is taken by an object another controller owns; never steal it."""


class LeftByEarlierJob(Exception):
    """Children of an earlier job of this name (deleted with --cascade=orphan) hold the names this
    job's children need. Never adopted: the operator never deletes, so the user is told which to
    delete, and the job starts once they are gone."""

    def __init__(self, leftovers: list[dict[str, Any]], uid: str) -> None:
        self.leftovers = leftovers
        first = leftovers[0]["metadata"]
        kinds = sorted({_PLURALS[o["kind"]] for o in leftovers})
        uids = sorted({_job_uid(o) or "unknown" for o in leftovers})
        selector = f"{MANAGED_BY_LABEL}={OPERATOR_NAME},{JOB_LABEL}={first['labels'][JOB_LABEL]}"
        super().__init__(
            f"{', '.join(child_key(o) for o in leftovers)} were left by an earlier LLMTrainingJob of "
            f"this name (uid {', '.join(uids)}; deleted with --cascade=orphan) and are never reused: "
            "they hold that job's config, run id, identity or Ray job. Delete them and this job "
            f"starts: kubectl delete {','.join(kinds)} -n {first['namespace']} -l "
            f"'{selector},{JOB_UID_LABEL}!={uid}'"
        )


class EarlierPodsRemain(Exception):
    """Pods of an earlier job of this name are still there (terminating, or orphaned). The new
    RayJob waits for them: the kubelet serves an immutable ConfigMap from its cache for as long as
    a pod that mounts it runs on the node, so a new pod mounting this job's config under the same
    name would read the earlier job's, and an earlier trainer still running would write
    checkpoints into the shared storage the new run resumes from."""

    def __init__(self, pods: list[dict[str, Any]], uid: str) -> None:
        self.pods = pods
        meta = pods[0]["metadata"]
        names = sorted(p["metadata"]["name"] for p in pods)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        uids = sorted({str((p["metadata"].get("labels") or {}).get(JOB_UID_LABEL, "unknown")) for p in pods})
        lingering = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        message = (
            f"{len(pods)} pod(s) of an earlier LLMTrainingJob of this name (uid {', '.join(uids)}) "
            f"are still there ({shown}); this job's Ray cluster starts once they are gone, so that it "
            "never reads that job's config nor shares its checkpoints with a trainer still running"
        )
        if lingering:
            selector = f"{JOB_LABEL}={meta['labels'][JOB_LABEL]},{JOB_UID_LABEL}!={uid}"
            message += (
                f"; {len(lingering)} of them are not being deleted (orphaned): "
                f"kubectl delete pods -n {meta['namespace']} -l '{selector}'"
            )
        super().__init__(message)


def earlier_pods(kube: Kube, rayjob: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Pods labelled with this job's name but not its uid (none: made before pods carried it)."""
    meta = rayjob["metadata"]
    uid = (meta.get("labels") or {}).get(JOB_UID_LABEL)
    if not uid:
        return []
    selector = f"{JOB_LABEL}={meta['labels'][JOB_LABEL]},{JOB_UID_LABEL}!={uid}"
    return kube.list_all(PODS, meta["namespace"], label_selector=selector)


class ChildBeingReplaced(Exception):
    """A child's name is still held by the child of an earlier job of the same name (deleted, its
    children being garbage-collected): wait for it to go, never adopt it."""


@dataclass
class EnsureResult:
    created: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    rayjob: dict[str, Any] = field(default_factory=dict)


def child_key(obj: Mapping[str, Any]) -> str:
    """How EnsureResult names a child: Kind/name."""
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _controller_uid(obj: dict[str, Any]) -> str | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            uid: str | None = ref.get("uid")
            return uid
    return None


def _carries_our_marks(desired: dict[str, Any], existing: dict[str, Any]) -> bool:
    want = desired["metadata"].get("labels") or {}
    have = existing["metadata"].get("labels") or {}
    return have.get(MANAGED_BY_LABEL) == OPERATOR_NAME and have.get(JOB_LABEL) == want.get(JOB_LABEL)


def _held_by_earlier_namesake(desired: dict[str, Any], existing: dict[str, Any]) -> bool:
    """The existing child's controller is a job of our kind and name but another uid. Names are
    unique, so that job no longer exists and the garbage collector will delete the child."""
    ours = (desired["metadata"].get("ownerReferences") or [{}])[0]
    # A retained claim has no owner reference: its job label names the job.
    name = ours.get("name") or (desired["metadata"].get("labels") or {}).get(JOB_LABEL)
    for ref in existing["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return bool(
                ref.get("kind") == KIND and ref.get("apiVersion") == GROUP_VERSION and ref.get("name") == name
            )
    return False


def _retained_but_owned(desired: dict[str, Any], existing: dict[str, Any]) -> bool:
    """A claim rendered without an owner (`reclaim: Retain`) that this very job controls."""
    return (
        desired["kind"] == "PersistentVolumeClaim"
        and not desired["metadata"].get("ownerReferences")
        and _job_uid(desired) is not None
        and _controller_uid(existing) == _job_uid(desired)
    )


def drift_patch(
    desired: dict[str, Any], existing: dict[str, Any], kueue_managed: bool = False
) -> dict[str, Any]:
    """The merge patch that brings an existing child back to the operator-managed state;
    `kueue_managed`: Kueue was found managing the RayJob without a queue label (it is marked so)."""
    patch: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    want_labels = desired["metadata"].get("labels", {})
    have_labels = existing["metadata"].get("labels") or {}
    missing = {k: v for k, v in want_labels.items() if have_labels.get(k) != v}
    if missing:
        meta["labels"] = missing
    if desired["kind"] == "RayJob":
        want = (desired["metadata"].get("annotations") or {}).get(SUSPENDED_BY_USER_ANNOTATION)
        have = (existing["metadata"].get("annotations") or {}).get(SUSPENDED_BY_USER_ANNOTATION)
        annotations = {}
        if want != have:
            annotations[SUSPENDED_BY_USER_ANNOTATION] = want  # None removes it
        if kueue_managed and not kueue_owns_suspend(existing):
            annotations[KUEUE_MANAGED_ANNOTATION] = "true"
        if annotations:
            meta["annotations"] = annotations
    want_owner = desired["metadata"].get("ownerReferences") or []
    have_owner = existing["metadata"].get("ownerReferences") or []
    if want_owner and _controller_uid(existing) is None:
        meta["ownerReferences"] = have_owner + want_owner
    elif _retained_but_owned(desired, existing):
        # Made by an operator before `reclaim` (every created claim was owned then): the spec now
        # says Retain, so the garbage collector must not delete it with the job.
        uid = _job_uid(desired)
        meta["ownerReferences"] = [r for r in have_owner if r.get("uid") != uid] or None
    if meta:
        patch["metadata"] = meta
    kind = desired["kind"]
    if kind == "RayJob":
        spec_patch = {}
        for name in rayjob_synced_fields(desired, existing, kueue_managed):
            want, have = desired["spec"].get(name), existing.get("spec", {}).get(name)
            if name == "suspend":  # KubeRay's writes drop a false suspend (Go omitempty)
                want, have = bool(want), bool(have)
            if want != have:
                spec_patch[name] = want  # None removes it (merge patch)
        if spec_patch:
            patch["spec"] = spec_patch
    else:
        for name in _SYNCED_FIELDS.get(kind, ()):  # lists only: a merge patch replaces them whole
            if desired.get(name) != existing.get(name):
                patch[name] = desired.get(name)
    return patch


def read_child(kube: Kube, desired: dict[str, Any]) -> dict[str, Any] | None:
    """The child as stored under its name, None if there is none."""
    meta = desired["metadata"]
    try:
        return kube.get(resource_of(desired), meta["namespace"], meta["name"])
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def _job_uid(obj: Mapping[str, Any]) -> str | None:
    uid = (obj["metadata"].get("labels") or {}).get(JOB_UID_LABEL)
    return str(uid) if uid else None


def _left_by_earlier_job(desired: dict[str, Any], existing: dict[str, Any]) -> bool:
    """A child without a controller that carries our marks, but another uid (or none: made before
    children carried it): left by an earlier job of this name, deleted with --cascade=orphan. Its
    config, run id, identity or run are that job's, never this one's. A claim is different: its data
    is what orphaning keeps, and a new run writes to a directory of its own on it."""
    want = _job_uid(desired)
    return (
        desired["kind"] != "PersistentVolumeClaim"
        and want is not None
        and _controller_uid(existing) is None
        and _carries_our_marks(desired, existing)
        and _job_uid(existing) != want
    )


def _claim(desired: dict[str, Any], existing: dict[str, Any]) -> None:
    """Raise unless the existing child is this job's to keep in sync (its own, or ours to adopt)."""
    meta = desired["metadata"]
    owner = (meta.get("ownerReferences") or [{}])[0].get("uid")
    # A retained claim (storage.create.reclaim: Retain) is rendered without an owner; its uid label
    # still says which job it is checked for.
    mine = owner or _job_uid(desired)
    holder = _controller_uid(existing)
    if holder is not None and mine is not None and holder != mine:
        if existing["metadata"].get("deletionTimestamp") or _held_by_earlier_namesake(desired, existing):
            raise ChildBeingReplaced(
                f"{child_key(desired)} still belongs to an earlier job of the same name (uid {holder}) "
                "that is being garbage-collected; waiting for it to go"
            )
        raise OwnershipConflict(
            f"{child_key(desired)} already exists and is controlled by another object (uid {holder}); "
            "rename the LLMTrainingJob or delete that object"
        )
    if holder is None and mine is not None and not _carries_our_marks(desired, existing):
        raise OwnershipConflict(
            f"{child_key(desired)} already exists and was not created by llmtrain for this job (it lacks "
            f"the labels {MANAGED_BY_LABEL}={OPERATOR_NAME} and {JOB_LABEL}={meta['labels'][JOB_LABEL]}); "
            "llmtrain never takes over an object it did not create: rename the LLMTrainingJob, or "
            "delete or rename that object"
        )
    if holder is None and owner is not None and desired["kind"] not in ADOPTED_KINDS:
        raise OwnershipConflict(
            f"{child_key(desired)} carries this job's labels but no owner reference (removed by hand?): "
            "llmtrain gives an owner reference to an existing claim only, so the garbage collector "
            "would never delete it with the job. Delete it, then the job, and apply the job again: "
            f"kubectl delete {_PLURALS[desired['kind']]} {meta['name']} -n {meta['namespace']}"
        )


def ensure(
    kube: Kube,
    desired: dict[str, Any],
    result: EnsureResult,
    existing: dict[str, Any] | None,
    before_create: Callable[[dict[str, Any]], None] | None = None,
    kueue_manages: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """Create the child if `existing` (as just read) is None, else adopt and re-sync it.

    Read before create: in a namespace at its ResourceQuota the API server answers a create of an
    object that already exists with 403 "exceeded quota" before it checks the name (and a create
    it admits then refuses with 409 still counts against the quota until the quota controller
    resyncs). `before_create` may raise to stop a create (the job finished meanwhile).

    A RayJob Kueue manages without a queue label is marked so (`KUEUE_MANAGED_ANNOTATION`): one
    stored suspended although rendered running (Kueue's webhook suspended it), or, when the
    operator would write its `suspend`, one `kueue_manages` finds a Workload of."""
    meta = desired["metadata"]
    if existing is None:
        if before_create is not None:
            before_create(desired)
        try:
            return _create(kube, desired, result)
        except ApiError as err:
            if err.status not in (403, 409):
                raise
            existing = read_child(kube, desired)  # created meanwhile (409), or refused for quota (403)
            if existing is None:
                if err.status == 403:
                    raise
                raise ApiError(
                    409, "Conflict", f"{child_key(desired)} conflicted on create but is not there"
                ) from err
    if _left_by_earlier_job(desired, existing):
        raise LeftByEarlierJob([existing], str(_job_uid(desired)))
    _claim(desired, existing)
    managed = (
        desired["kind"] == "RayJob"
        and kueue_manages is not None
        and not kueue_owns_suspend(desired)
        and not kueue_owns_suspend(existing)
        and bool(desired["spec"].get("suspend")) != bool((existing.get("spec") or {}).get("suspend"))
        and kueue_manages(existing)
    )
    patch = drift_patch(desired, existing, managed)
    if not patch:
        return existing
    if _controller_uid(existing) is None:
        result.adopted.append(child_key(desired))
    else:
        result.patched.append(child_key(desired))
    return kube.merge_patch(resource_of(desired), meta["namespace"], meta["name"], patch)


def _create(kube: Kube, desired: dict[str, Any], result: EnsureResult) -> dict[str, Any]:
    """Create the child; a RayJob Kueue's webhook suspended on admission is marked Kueue's."""
    created = kube.create(desired)
    result.created.append(child_key(desired))
    if desired["kind"] == "RayJob" and _suspended_on_admission(desired, created):
        meta = desired["metadata"]
        patch = {"metadata": {"annotations": {KUEUE_MANAGED_ANNOTATION: "true"}}}
        created = kube.merge_patch(resource_of(desired), meta["namespace"], meta["name"], patch)
    return created


def _suspended_on_admission(desired: Mapping[str, Any], created: Mapping[str, Any]) -> bool:
    """Rendered running, stored suspended, no queue label: Kueue's webhook (manageJobsWithoutQueueName)
    suspended it, and Kueue owns its `suspend` from now on."""
    return (
        not kueue_owns_suspend(created)
        and not desired["spec"].get("suspend")
        and bool((created.get("spec") or {}).get("suspend"))
    )


def sync_if_present(kube: Kube, desired: dict[str, Any]) -> dict[str, Any] | None:
    """Re-sync the managed fields of a child that exists and is ours; never create one."""
    meta = desired["metadata"]
    try:
        existing = kube.get(resource_of(desired), meta["namespace"], meta["name"])
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    owner = (meta.get("ownerReferences") or [{}])[0].get("uid")
    if _controller_uid(existing) != owner:
        return None
    patch = drift_patch(desired, existing)
    if not patch:
        return existing
    return kube.merge_patch(resource_of(desired), meta["namespace"], meta["name"], patch)


def ensure_all(
    kube: Kube,
    objects: list[dict[str, Any]],
    before_rayjob_create: Callable[[dict[str, Any]], None] | None = None,
    kueue_manages: Callable[[dict[str, Any]], bool] | None = None,
    create_first: bool = False,
) -> EnsureResult:
    """Every child read first, then created or re-synced in render order. Children an earlier job
    of this name left are all named at once, before anything is created or changed.
    `before_rayjob_create` runs just before the RayJob is created (not when it exists): the last
    chance to see that the job finished or went, since creating a RayJob starts training.
    `kueue_manages`: whether Kueue manages an existing RayJob without a queue label (see `ensure`).

    `create_first`: the job's first try, whose children should not exist. Each is created without
    the read (one request instead of two, the same guards before the RayJob); the first create
    answered 409 (it exists: an interrupted try, an earlier namesake's leftovers) or 403 (a quota
    or an admission policy) stops that, and it and the rest are read first as on any other try.
    What this try created is this job's own, so leftovers are still all named at once. A RayJob
    reached this way follows children this very try created (each answered 201): none existed,
    so no earlier try of this job got as far as its RayJob, which they precede, and nothing can
    have run or finished it: `before_rayjob_create` is not asked (a read of the job saved)."""
    result = EnsureResult()
    pending = list(objects)
    while create_first and pending:
        obj = pending[0]
        if obj["kind"] == "RayJob":
            # Every earlier child answered 201 here (the first that did not ended this loop), so
            # `before_rayjob_create` is not asked (see above).
            _hold_for_earlier_pods(kube, obj)
        try:
            stored = _create(kube, obj, result)
        except ApiError as err:
            if err.status not in (403, 409):
                raise
            break
        pending.pop(0)
        if obj["kind"] == "RayJob":
            result.rayjob = stored
            _refuse_unauthenticated(kube, obj, stored)
    found = [(obj, read_child(kube, obj)) for obj in pending]
    leftovers = [old for obj, old in found if old is not None and _left_by_earlier_job(obj, old)]
    if leftovers:
        raise LeftByEarlierJob(leftovers, str(_job_uid(objects[0])))
    for obj, existing in found:
        guard = before_rayjob_create if obj["kind"] == "RayJob" else None
        if obj["kind"] == "RayJob" and existing is None:
            _hold_for_earlier_pods(kube, obj)
        stored = ensure(kube, obj, result, existing, guard, kueue_manages)
        if obj["kind"] == "RayJob":
            result.rayjob = stored
            _refuse_unauthenticated(kube, obj, stored)
    return result


def _hold_for_earlier_pods(kube: Kube, rayjob: dict[str, Any]) -> None:
    """Raise EarlierPodsRemain while pods of an earlier job of this name are there."""
    if pods := earlier_pods(kube, rayjob):
        raise EarlierPodsRemain(pods, str(_job_uid(rayjob)))


def _refuse_unauthenticated(kube: Kube, desired: dict[str, Any], stored: dict[str, Any]) -> None:
    """A RayJob stored without its auth is suspended at once (KubeRay then deletes its cluster, or
    never makes one), and AuthDropped fails the job. Kueue owns a queued RayJob's `suspend`: the
    caller deactivates its Workload instead."""
    if not auth_dropped(desired, stored):
        return
    meta = stored["metadata"]
    if not kueue_owns_suspend(stored) and not stored.get("spec", {}).get("suspend"):
        kube.merge_patch(resource_of(desired), meta["namespace"], meta["name"], {"spec": {"suspend": True}})
    raise AuthDropped(
        f"the API server stored RayJob {meta['name']} without spec.rayClusterSpec.authOptions: the "
        "installed RayJob CRD predates Ray token authentication, so the Ray dashboard and job API "
        "would be open to anyone who reaches them. Install KubeRay v1.5.1 or later (its CRDs "
        "first), then re-create this job; the RayJob was stopped",
        stored,
    )
