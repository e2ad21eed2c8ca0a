"""A queued job's suspend, the way Kueue expects it: through its Workload's `spec.active`.

Kueue owns `spec.suspend` of a queued RayJob (it un-suspends on admission and suspends on
preemption), so writing it would fight Kueue. Deactivating the job's Workload makes Kueue evict it
(and suspend the RayJob itself, releasing the quota); re-activating queues it again.

Kueue deactivates Workloads too: when the maximum execution time is exceeded or the requeuing limit
is reached (it first sets the `DeactivationTarget` condition, then `spec.active: false`, then evicts
with reason `DeactivatedDueTo<cause>`), and an administrator does with `kueuectl stop workload`.
The operator re-activates only a Workload it deactivated itself (it marks it so): anything else
would undo Kueue's verdict and hand the job GPUs again.

The Workload API version is discovered (`KUEUE_API`): Kueue serves v1beta2 only from v0.15, and a
cluster may have no Kueue at all.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtrain.constants import (
    KUEUE_GROUP,
    KUEUE_JOB_UID_LABEL,
    KUEUE_VERSIONS,
    KUEUE_WORKLOAD_PLURAL,
    SUSPENDED_BY_USER_ANNOTATION,
)
from llmtrain.operator.kube import ApiError, Kube, Resource

# Kueue's names (apis/kueue/v1beta2/workload_types.go, the same in v1beta1).
DEACTIVATION_TARGET = "DeactivationTarget"
EVICTED = "Evicted"
DEACTIVATED = "Deactivated"
_DUE_TO = f"{DEACTIVATED}DueTo"  # Kueue's eviction reason for its own deactivations, plus the cause


class WorkloadNotYet(Exception):
    """Kueue has not made the job's Workload yet (it does so right after the RayJob appears)."""


class KueueUnavailable(Exception):
    """The cluster serves no Workload API this operator speaks: Kueue is not installed (yet), or
    serves only versions it does not know. The message says which, for the job's status."""


@dataclass(frozen=True)
class Deactivation:
    """A Workload deactivated by someone other than this operator: `cause` is Kueue's reason
    (MaximumExecutionTimeExceeded, RequeuingLimitExceeded, ...), or "" when it names none (an
    administrator's `kueuectl stop workload`)."""

    workload: str
    cause: str
    message: str

    @property
    def by_kueue(self) -> bool:
        """Kueue's own verdict on the job: final, it is never admitted again."""
        return bool(self.cause)

    def describe(self) -> str:
        if self.by_kueue:
            return (
                f"Kueue deactivated the job's Workload {self.workload} ({self.cause}: {self.message}); "
                "it is not admitted again and its Ray cluster was stopped"
            )
        return (
            f"the job's Kueue Workload {self.workload} was deactivated outside llmtrain (for example "
            f"kueuectl stop workload): it waits until it is activated again ({self.message})"
        )


@dataclass(frozen=True)
class Synced:
    """What `set_active` did: `changed` a Workload; `deactivation`: one it left inactive."""

    changed: bool = False
    deactivation: Deactivation | None = None


def pick_version(group: Mapping[str, Any] | None) -> str:
    """The Workload version to use from the API group's discovery document (None: not served):
    the preferred one if the operator speaks it, else the best it speaks."""
    if group is None:
        raise KueueUnavailable(
            f"Kueue is not installed: the cluster serves no {KUEUE_GROUP} API. The job waits "
            "suspended for a Kueue to admit it (install Kueue, or remove runPolicy.queueName)"
        )
    served = [str(v.get("version")) for v in group.get("versions") or []]
    preferred = str((group.get("preferredVersion") or {}).get("version") or "")
    if preferred in KUEUE_VERSIONS:
        return preferred
    for version in KUEUE_VERSIONS:
        if version in served:
            return version
    raise KueueUnavailable(
        f"the installed Kueue serves {KUEUE_GROUP} {', '.join(served) or 'no version'}, and llmtrain "
        f"speaks {' or '.join(KUEUE_VERSIONS)}: install a Kueue that serves one of them"
    )


class KueueApi:
    """The Workload resource at the version the cluster serves. Found once and kept; forgotten
    after a 404 (Kueue removed or upgraded), and never kept while Kueue is missing, so a Kueue
    installed later is found at the next look."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resource: Resource | None = None

    def workloads(self, kube: Kube) -> Resource:
        with self._lock:
            if self._resource is not None:
                return self._resource
        try:
            group: dict[str, Any] | None = kube.request("GET", f"/apis/{KUEUE_GROUP}")
        except ApiError as err:
            if err.status != 404:
                raise
            group = None
        resource = Resource(KUEUE_GROUP, pick_version(group), KUEUE_WORKLOAD_PLURAL)
        with self._lock:
            self._resource = resource
        return resource

    def forget(self) -> None:
        with self._lock:
            self._resource = None


KUEUE_API = KueueApi()


def _condition(workload: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return dict(cond)
    return None


def _active(workload: Mapping[str, Any]) -> bool:
    return bool((workload.get("spec") or {}).get("active", True))


def _ours(workload: Mapping[str, Any]) -> bool:
    """This operator deactivated it, for its user's runPolicy.suspend."""
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    return annotations.get(SUSPENDED_BY_USER_ANNOTATION) == "true"


def deactivation(workload: Mapping[str, Any]) -> Deactivation | None:
    """Why an inactive Workload this operator did not deactivate is inactive; None when it is
    active or the operator's own doing. Kueue's cause is on `DeactivationTarget` until it evicts,
    then in the `Evicted` reason."""
    if _active(workload) or _ours(workload):
        return None
    name = str((workload.get("metadata") or {}).get("name"))
    target = _condition(workload, DEACTIVATION_TARGET)
    if target is not None:
        return Deactivation(name, str(target.get("reason") or DEACTIVATED), str(target.get("message") or ""))
    evicted = _condition(workload, EVICTED)
    reason = str((evicted or {}).get("reason") or "")
    message = str((evicted or {}).get("message") or "spec.active is false")
    if reason.startswith(_DUE_TO) and len(reason) > len(_DUE_TO):
        return Deactivation(name, reason[len(_DUE_TO) :], message)
    return Deactivation(name, "", message)


def _list(kube: Kube, rayjob: Mapping[str, Any]) -> tuple[Resource, list[dict[str, Any]]]:
    meta = rayjob["metadata"]
    resource = KUEUE_API.workloads(kube)
    try:
        found = kube.list_all(
            resource, meta["namespace"], label_selector=f"{KUEUE_JOB_UID_LABEL}={meta['uid']}"
        )
    except ApiError as err:
        if err.status == 404:  # that version is no longer served: look again next time
            KUEUE_API.forget()
        raise
    return resource, found


def manages(kube: Kube, rayjob: Mapping[str, Any]) -> bool:
    """Kueue made a Workload of the RayJob: it manages it (with or without a queue label). No
    Kueue to ask means no."""
    try:
        _, found = _list(kube, rayjob)
    except KueueUnavailable:
        return False
    return bool(found)


def deactivated(kube: Kube, rayjob: Mapping[str, Any]) -> Deactivation | None:
    """How the RayJob's Workload was deactivated by someone else, if it was."""
    _, found = _list(kube, rayjob)
    return next((d for d in map(deactivation, found) if d is not None), None)


def set_active(kube: Kube, rayjob: Mapping[str, Any], active: bool) -> Synced:
    """Bring the Workloads of `rayjob` to `active`, as far as the operator may: one deactivated by
    Kueue or an administrator is left inactive, and reported.

    Raises WorkloadNotYet when there is none yet and it must be deactivated: a job created
    suspended must never be admitted in between. KueueUnavailable and ApiError pass through.
    """
    meta = rayjob["metadata"]
    resource, workloads = _list(kube, rayjob)
    if not workloads and not active:
        raise WorkloadNotYet(f"waiting for Kueue's Workload of RayJob {meta['name']} to deactivate it")
    changed = False
    left: Deactivation | None = None
    for wl in workloads:
        foreign = deactivation(wl)
        if foreign is not None:
            left = left or foreign  # never re-activated; deactivating it again changes nothing
            continue
        if _active(wl) != active:
            mark = "true" if not active else None  # None removes it (merge patch)
            patch = {
                "metadata": {"annotations": {SUSPENDED_BY_USER_ANNOTATION: mark}},
                "spec": {"active": active},
            }
            kube.merge_patch(resource, meta["namespace"], wl["metadata"]["name"], patch)
            changed = True
    return Synced(changed, left)
