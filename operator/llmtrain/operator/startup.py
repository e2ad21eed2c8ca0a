"""A starting job's mirror: the thin I/O around `diagnosis.diagnose` and the start-up deadline.

While a RayJob's attempt is starting (KubeRay's Initializing or Waiting), each mirror of it (its
events, and the periodic resync pass) reads the job's Ray pods, the namespace's Warning Events and,
when a pod is unschedulable, the nodes, so the status names what keeps the cluster from starting.
Nothing in a RayJob changes while its pods wait on an image, a Secret or a node, so no event
brings that cause: the jobs the mirror last saw starting (`STARTING`) are mirrored again every
`startup_look_seconds` by the resync thread (`mirror.look_at_starting`).

The deadline is judged from KubeRay's `status.startTime`, never from a timer, so a restarted
operator judges it the same. Once it has passed (by the operator's clock, or KubeRay's
`PreRunningDeadlineExceeded`), the job is Failed first and its RayJob stopped after: suspended
(or, when Kueue owns `suspend`, its Workload deactivated), which deletes the Ray cluster and its
pods (a retry KubeRay has begun included), and `ttlSecondsAfterFinished: 0`, which deletes a
cluster KubeRay already failed. KubeRay retries an attempt past its own deadline (its backoffLimit
counts a start-up expiry as a failure), so it gets the deadline later by
`STARTUP_BACKSTOP_SECONDS` (render/rayjob.py): this check comes first, KubeRay's is the backstop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from typing import Any

from llmtrain.api.spec import DEFAULT_STARTUP_DEADLINE_SECONDS
from llmtrain.constants import (
    JOB_LABEL,
    JOB_UID_LABEL,
    RAY_GROUP_VERSION,
    RAYJOB_KIND,
    SUSPENDED_BY_USER_ANNOTATION,
)
from llmtrain.operator import reporting, workload
from llmtrain.operator.children import kueue_owns_suspend
from llmtrain.operator.diagnosis import (
    KUBERAY_EXPIRY,
    STARTING_DEPLOYMENT,
    Diagnosis,
    diagnose,
    starting_for,
    startup_expired,
)
from llmtrain.operator.kube import RESOURCES, ApiError, Kube
from llmtrain.operator.status import (
    KUEUE_DEACTIVATED,
    Failure,
    Report,
    Startup,
    Step,
    Waiting,
    finished,
    startup_failed,
)

PODS = RESOURCES[("v1", "Pod")]
EVENTS = RESOURCES[("v1", "Event")]
NODES = RESOURCES[("v1", "Node")]
RAYJOBS = RESOURCES[(RAY_GROUP_VERSION, RAYJOB_KIND)]
# An attempt this young is not looked into: its pods are normally still being scheduled and pulled,
# and a burst of new jobs then costs no reads of pods and Events. A cause shows from the first
# RayJob event or resync pass after it.
LOOK_AFTER_SECONDS = 10.0
# How often a queued job without a Kueue to speak to is looked at again, at most (the resync pass;
# the reconciler backs off on its own): said in its status.
KUEUE_LOOK_SECONDS = 120.0
log = logging.getLogger(__name__)


class StartingJobs:
    """The jobs whose Ray cluster the last mirror saw starting: job key -> (namespace, job name,
    RayJob name). In memory only: the resync pass mirrors every job, which fills it again after a
    restart or a missed event."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, tuple[str, str, str]] = {}

    def note(self, job: Mapping[str, Any], rayjob: Mapping[str, Any], is_starting: bool) -> None:
        meta = job["metadata"]
        key = reporting.job_key(meta)
        with self._lock:
            if is_starting:
                self._jobs[key] = (meta["namespace"], meta["name"], rayjob["metadata"]["name"])
            else:
                self._jobs.pop(key, None)

    def forget(self, key: str) -> None:
        with self._lock:
            self._jobs.pop(key, None)

    def items(self) -> list[tuple[str, tuple[str, str, str]]]:
        with self._lock:
            return list(self._jobs.items())


STARTING = StartingJobs()


def mirror(kube: Kube, job: Mapping[str, Any], rayjob: Mapping[str, Any]) -> Report:
    """`report(MIRRORED)` with what blocks a starting job; stops the RayJob of a job that failed to
    start (again, if an earlier stop did not get through). A queued job Kueue suspended is failed
    if Kueue deactivated its Workload for good, or told to wait if there is no Kueue to speak to."""
    kueue = _kueue_verdict(kube, job, rayjob)
    if kueue is not None:
        STARTING.note(job, rayjob, False)
        return reporting.report(kube, job, None, kueue)
    deadline = deadline_seconds(job)
    now = reporting.now()
    # A RayJob being suspended (by its user or by Kueue) still reads Initializing until KubeRay gets
    # to it, which under a burst takes longer than LOOK_AFTER_SECONDS: it starts no pods, so there
    # is nothing to look into (two LISTs saved per queued job) unless its deadline has passed.
    worth_a_look = starting(rayjob) and (
        startup_expired(rayjob, deadline, now)
        or (not suspended(rayjob) and starting_for(rayjob, now) >= LOOK_AFTER_SECONDS)
    )
    startup = Startup(deadline, look(kube, job, rayjob) if worth_a_look else None)
    said = reporting.report(kube, job, rayjob, Step.MIRRORED, startup=startup)
    failed = said.stop_rayjob or startup_failed(job.get("status") or {})
    if failed:
        stop(kube, rayjob)
        reporting.mark_finished(kube, job, rayjob["metadata"]["name"])  # only once it is stopped
    STARTING.note(job, rayjob, starting(rayjob) and not suspended(rayjob) and not failed)
    return said


def _kueue_verdict(kube: Kube, job: Mapping[str, Any], rayjob: Mapping[str, Any]) -> Failure | Waiting | None:
    """For an unfinished queued job whose RayJob is suspended (Kueue holds it, or evicted it) and
    that its user did not suspend: Failure when Kueue deactivated its Workload itself, Waiting when
    the cluster serves no Workload API the operator speaks. One list of the job's Workloads; a
    failed read leaves the ordinary mirror ("queued") in place."""
    state = (rayjob.get("status") or {}).get("jobDeploymentStatus")
    annotations = (rayjob.get("metadata") or {}).get("annotations") or {}
    if (
        not _queued(rayjob)
        or state not in ("Suspending", "Suspended")
        or annotations.get(SUSPENDED_BY_USER_ANNOTATION) == "true"
        or finished(job.get("status") or {})
    ):
        return None
    try:
        found = workload.deactivated(kube, rayjob)
    except workload.KueueUnavailable as exc:
        return Waiting(str(exc), KUEUE_LOOK_SECONDS)
    except ApiError as err:
        log.warning(f"cannot read the Kueue Workload of {reporting.job_key(job['metadata'])}: {err}")
        return None
    if found is None or not found.by_kueue:
        return None
    return Failure(KUEUE_DEACTIVATED, found.describe())


def starting(rayjob: Mapping[str, Any]) -> bool:
    status = rayjob.get("status") or {}
    return status.get("jobDeploymentStatus") in STARTING_DEPLOYMENT or status.get("reason") == KUBERAY_EXPIRY


def suspended(rayjob: Mapping[str, Any]) -> bool:
    """Whether the RayJob is asked to be suspended (its cluster goes, whatever its status says yet)."""
    return (rayjob.get("spec") or {}).get("suspend") is True


def deadline_seconds(job: Mapping[str, Any]) -> int:
    """The job's runPolicy.startupDeadlineSeconds (the CRD defaults it; a job stored before the
    field existed has the default)."""
    value = ((job.get("spec") or {}).get("runPolicy") or {}).get("startupDeadlineSeconds")
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_STARTUP_DEADLINE_SECONDS


def look(kube: Kube, job: Mapping[str, Any], rayjob: Mapping[str, Any]) -> Diagnosis | None:
    """What keeps the job's Ray cluster from starting, read from the API. Best effort: a failed read
    leaves the cause unnamed this time (logged), never the mirror undone."""
    meta = job["metadata"]
    namespace = meta["namespace"]
    try:
        pods = kube.list_all(PODS, namespace, label_selector=f"{JOB_LABEL}={meta['name']}")
        events = kube.list_all(EVENTS, namespace, field_selector="type=Warning")
        nodes = _nodes(kube) if any(_unschedulable(p) for p in pods) else []
    except ApiError as err:
        log.warning(f"cannot read what blocks {namespace}/{meta['name']} from starting: {err}")
        return None
    cluster = (rayjob.get("status") or {}).get("rayClusterName")
    return diagnose(pods, events, nodes, str(cluster) if cluster else None)


def _nodes(kube: Kube) -> list[dict[str, Any]] | None:
    """Every node; None where the operator may not read them (a watchNamespaces install has no
    cluster-wide rights): the scheduler's message is quoted instead."""
    try:
        return kube.list_all(NODES, None)
    except ApiError as err:
        if err.status == 403:
            return None
        raise


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def stopped(rayjob: Mapping[str, Any]) -> dict[str, Any]:
    """The RayJob as a job that failed to start keeps it: suspended (unless Kueue owns `suspend`)
    and its cluster deleted as soon as KubeRay finishes it. The reconciler syncs a finished job's
    RayJob to this form, so an edit of the job never resumes it."""
    out = {**rayjob, "spec": {**(rayjob.get("spec") or {}), "ttlSecondsAfterFinished": 0}}
    if not _queued(rayjob):
        out["spec"]["suspend"] = True
    return out


def stop(kube: Kube, rayjob: Mapping[str, Any]) -> None:
    """Stop a RayJob whose job failed to start; nothing when it already is."""
    meta = rayjob["metadata"]
    spec = rayjob.get("spec") or {}
    patch: dict[str, Any] = {}
    if spec.get("ttlSecondsAfterFinished") != 0:
        patch["ttlSecondsAfterFinished"] = 0
    if not _queued(rayjob) and not spec.get("suspend"):
        patch["suspend"] = True
    if patch:
        kube.merge_patch(RAYJOBS, meta["namespace"], meta["name"], {"spec": patch})
    if _queued(rayjob) and meta.get("uid"):
        # Kueue owns a queued RayJob's suspend: deactivating its Workload makes Kueue suspend it.
        with contextlib.suppress(workload.WorkloadNotYet, workload.KueueUnavailable):
            workload.set_active(kube, dict(rayjob), False)


def stop_and_mark(kube: Kube, job: Mapping[str, Any]) -> None:
    """A job that failed to start, seen unlabelled: its RayJob stopped (when it is there and this
    job's), then the job labelled finished. Labelled, it leaves Kopf's view and the resync's, so
    nothing would stop the RayJob after that; `reporting.report` leaves such a job unlabelled."""
    meta = job["metadata"]
    name = str((job.get("status") or {}).get("rayJobName") or "")
    if name:
        try:
            rayjob = kube.get(RAYJOBS, meta["namespace"], name)
        except ApiError as err:
            if err.status != 404:
                raise
        else:
            if (rayjob["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == meta.get("uid"):
                stop(kube, rayjob)
    reporting.mark_finished(kube, job, name or None)


def _queued(rayjob: Mapping[str, Any]) -> bool:
    return kueue_owns_suspend(rayjob)
