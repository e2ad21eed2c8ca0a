"""A queued job's suspend, the way Kueue expects it: through its Workload's `spec.active`.

Kueue owns `spec.suspend` of a queued RayJob (it un-suspends on admission and suspends on
preemption), so writing it would fight Kueue. Deactivating the job's Workload makes Kueue evict it
(and suspend the RayJob itself, releasing the quota); re-activating queues it again.
"""

from __future__ import annotations

from typing import Any

from llmtrain.constants import KUEUE_GROUP, KUEUE_JOB_UID_LABEL, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL
from llmtrain.operator.kube import Kube, Resource

WORKLOADS = Resource(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL)


class WorkloadNotYet(Exception):
    """Kueue has not made the job's Workload yet (it does so right after the RayJob appears)."""


def set_active(kube: Kube, rayjob: dict[str, Any], active: bool) -> bool:
    """Bring the Workloads of `rayjob` to `active`; True when one was changed.

    Raises WorkloadNotYet when there is none yet and it must be deactivated: a job created
    suspended must never be admitted in between.
    """
    meta = rayjob["metadata"]
    selector = f"{KUEUE_JOB_UID_LABEL}={meta['uid']}"
    workloads = kube.list_all(WORKLOADS, meta["namespace"], label_selector=selector)
    if not workloads and not active:
        raise WorkloadNotYet(f"waiting for Kueue's Workload of RayJob {meta['name']} to deactivate it")
    changed = False
    for workload in workloads:
        if bool((workload.get("spec") or {}).get("active", True)) != active:
            kube.merge_patch(
                WORKLOADS, meta["namespace"], workload["metadata"]["name"], {"spec": {"active": active}}
            )
            changed = True
    return changed
