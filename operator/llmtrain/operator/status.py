"""Pure: the LLMTrainingJob status the operator owns, from the job, its RayJob, and what a handler
found (`operator_status`, the one place that status is computed; `reporting.report` writes it).

The phase comes from `jobDeploymentStatus` + `reason`, never from `jobStatus` alone: KubeRay can
report `jobStatus: RUNNING` beside `jobDeploymentStatus: Failed` (kuberay#2314). `status.progress`
belongs to the trainer and is never produced here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, assert_never

from llmtrain.api.status import Phase
from llmtrain.constants import KUEUE_MANAGED_ANNOTATION, KUEUE_QUEUE_LABEL, SUSPENDED_BY_USER_ANNOTATION
from llmtrain.operator.diagnosis import Diagnosis, deadline_at, startup_expired

CONDITION_TYPES = ("Created", "Running", "Succeeded", "Failed", "Suspended")
# True while something named keeps the Ray cluster from starting; False once it started or nothing
# is found. Written only once a cause was seen.
STARTUP_CONDITION = "StartupBlocked"
STARTUP_EXPIRED = "StartupDeadlineExceeded"


@dataclass(frozen=True)
class Observed:
    """What one RayJob status means for its LLMTrainingJob."""

    phase: Phase
    reason: str
    message: str


# jobDeploymentStatus -> (phase, reason when the RayJob gives none)
_DEPLOYMENT: dict[str, tuple[Phase, str]] = {
    "": ("Pending", "RayJobCreated"),
    "New": ("Pending", "RayJobCreated"),
    "Initializing": ("Initializing", "RayClusterStarting"),
    "Waiting": ("Initializing", "WaitingForSubmission"),
    "Running": ("Running", "Training"),
    "Retrying": ("Initializing", "Retrying"),
    "Suspending": ("Suspended", "Suspending"),
    "Suspended": ("Suspended", "Suspended"),
    "Complete": ("Succeeded", "Completed"),
    "Failed": ("Failed", "Failed"),
    "ValidationFailed": ("Failed", "ValidationFailed"),
}

_MESSAGES: dict[str, str] = {
    "RayJobCreated": "RayJob created; waiting for KubeRay",
    "RayClusterStarting": "Ray cluster is starting",
    "Resuming": "starting a new Ray cluster; training resumes from the latest checkpoint",
    "WaitingForSubmission": "waiting for the job submission",
    "Training": "training",
    "Retrying": "retrying on a new Ray cluster; training resumes from the latest checkpoint",
    "Suspending": "suspending: the Ray cluster is being deleted, checkpoints are kept",
    "Suspended": "suspended; set spec.runPolicy.suspend to false to resume from the latest checkpoint",
    "Completed": "training finished",
    "Stopped": "the Ray job was stopped before it finished",
    "AppFailed": "the training application failed",
    "DeadlineExceeded": "spec.runPolicy.activeDeadlineSeconds exceeded",
    "PreRunningDeadlineExceeded": "the Ray cluster did not start in time",
    "SubmissionFailed": "the job could not be submitted to the Ray cluster",
    "ValidationFailed": "KubeRay rejected the rendered RayJob",
}


TERMINAL: frozenset[Phase] = frozenset({"Succeeded", "Failed"})
_UNDER_WAY: frozenset[str] = frozenset({"Initializing", "Running", "Suspended"})


def observe(
    rayjob_status: dict[str, Any] | None, queue: str | None = None, suspended_by_user: bool = False
) -> Observed:
    """`queue`: the Kueue LocalQueue of a queued job ("" when Kueue manages it without one). Kueue
    owns such a RayJob's `suspend`, so a suspended one is waiting for admission (or was
    preempted), not suspended by its user, unless its user asked (`suspended_by_user`: its
    Workload is deactivated)."""
    status = rayjob_status or {}
    deployment = str(status.get("jobDeploymentStatus") or "")
    phase, reason = _DEPLOYMENT.get(deployment, ("Pending", "Unknown" + deployment))
    if deployment in ("Failed", "ValidationFailed") and status.get("reason"):
        reason = str(status["reason"])
    if deployment == "Complete" and status.get("jobStatus") == "STOPPED":
        # A stopped job also ends as Complete in KubeRay; it did not succeed.
        phase, reason = "Failed", "Stopped"
    detail = str(status.get("message") or "")
    base = _MESSAGES.get(reason, reason)
    where = f"LocalQueue {queue!r}" if queue else "Kueue (it manages jobs without a queue name here)"
    if queue is not None and phase == "Suspended" and suspended_by_user:
        base = (
            f"suspended (runPolicy.suspend): its Kueue Workload is deactivated and holds no quota in "
            f"{where}; set runPolicy.suspend to false to queue it again"
        )
    elif queue is not None and phase == "Suspended":
        phase, reason = "Pending", "Queued"
        base = (
            f"queued in {'Kueue ' if queue else ''}{where}: waiting for quota to admit it (a preempted "
            "job waits here too, and resumes from its latest checkpoint)"
        )
    if detail and (phase == "Failed" or reason == "Retrying"):
        # A retry keeps the failure that caused it: KubeRay's message names it.
        message = f"{base}: {detail}" if phase == "Failed" else f"{base} (after: {detail})"
    else:
        message = base
    return Observed(phase=phase, reason=reason, message=message)


def derive(
    rayjob: Mapping[str, Any],
    current: Mapping[str, Any],
    generation: int | None,
    now: str,
) -> tuple[dict[str, Any], Observed]:
    """The operator's whole part of a job's status, from its RayJob and the status as it is
    (conditions keep their transition times, the trainer's root cause joins a failure); and what
    the RayJob's state means (its reason names the transition's Event)."""
    metadata = rayjob["metadata"]  # a RayJob from the API always has it (mirrored_fields reads its name)
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    held = annotations.get(SUSPENDED_BY_USER_ANNOTATION) == "true"
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if queue is None and annotations.get(KUEUE_MANAGED_ANNOTATION) == "true":
        queue = ""
    observed = with_root_cause(
        observe(dict(rayjob.get("status") or {}), queue, held),
        current.get("progress"),
    )
    if observed.reason == "RayJobCreated" and current.get("phase") in _UNDER_WAY:
        # KubeRay passes through New again on a resume and after a retry's clean-up: the job is not
        # back to "created", it is starting its next Ray cluster.
        observed = Observed("Initializing", "Resuming", _MESSAGES["Resuming"])
    update = {
        **mirrored_fields(rayjob),
        "phase": observed.phase,
        "message": observed.message,
        "observedGeneration": generation,
        "conditions": conditions_for(
            observed.phase,
            observed.reason,
            observed.message,
            generation,
            list(current.get("conditions") or []),
            now,
        ),
    }
    return update, observed


def with_root_cause(observed: Observed, progress: Mapping[str, Any] | None) -> Observed:
    """On failure, add what the trainer reported (e.g. 'OutOfMemoryError on rank 3: ...')."""
    error = (progress or {}).get("error")
    if observed.phase != "Failed" or not error:
        return observed
    return Observed(observed.phase, observed.reason, f"{observed.message}; trainer reported: {error}")


def conditions_for(
    phase: Phase,
    reason: str,
    message: str,
    generation: int | None,
    existing: list[dict[str, Any]],
    now: str,
) -> list[dict[str, Any]]:
    """The full condition set for a phase; lastTransitionTime moves only when a status flips."""
    wanted = {
        "Created": True,
        "Running": phase == "Running",
        "Succeeded": phase == "Succeeded",
        "Failed": phase == "Failed",
        "Suspended": phase == "Suspended",
    }
    previous = {c.get("type"): c for c in existing}
    out = []
    for ctype in CONDITION_TYPES:
        status = "True" if wanted[ctype] else "False"
        old = previous.get(ctype)
        changed = old is None or old.get("status") != status
        cond: dict[str, Any] = {
            "type": ctype,
            "status": status,
            "reason": "RayJobCreated"
            if ctype == "Created"
            else (reason if status == "True" else f"Not{ctype}"),
            "message": message if status == "True" and ctype != "Created" else "",
            "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime", now),
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    # Keep conditions other writers own (e.g. InvalidSpec resolved later), updated by their writer.
    out.extend(c for c in existing if c.get("type") not in CONDITION_TYPES)
    return out


def invalid_spec_conditions(
    message: str, generation: int | None, existing: list[dict[str, Any]], now: str
) -> list[dict[str, Any]]:
    """The job cannot be rendered: InvalidSpec and Failed are True, nothing else claimed."""
    others = [c for c in existing if c.get("type") not in ("InvalidSpec", "Failed")]
    previous = {c.get("type"): c for c in existing}
    out = others
    for ctype in ("InvalidSpec", "Failed"):
        old = previous.get(ctype)
        cond: dict[str, Any] = {
            "type": ctype,
            "status": "True",
            "reason": "InvalidSpec",
            "message": message,
            "lastTransitionTime": old["lastTransitionTime"]
            if old and old.get("status") == "True" and old.get("lastTransitionTime")
            else now,
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    return out


def clear_invalid_spec(
    existing: list[dict[str, Any]], generation: int | None, now: str
) -> list[dict[str, Any]]:
    """Once a spec parses again, InvalidSpec turns False (it is not just dropped, so users see why)."""
    out = []
    for cond in existing:
        if cond.get("type") == "InvalidSpec" and cond.get("status") == "True":
            cond = {
                **cond,
                "status": "False",
                "reason": "SpecValid",
                "message": "",
                "lastTransitionTime": now,
            }
            if generation is not None:
                cond["observedGeneration"] = generation
        out.append(cond)
    return out


def mirrored_fields(rayjob: Mapping[str, Any]) -> dict[str, Any]:
    """The RayJob facts copied verbatim into the LLMTrainingJob status."""
    status = rayjob.get("status") or {}
    out: dict[str, Any] = {"rayJobName": rayjob["metadata"]["name"]}
    for src, dst in (
        ("rayClusterName", "rayClusterName"),
        ("dashboardURL", "dashboardURL"),
        ("startTime", "startTime"),
        ("endTime", "completionTime"),
    ):
        # None clears (merge patch) what the RayJob no longer has, e.g. the cluster a suspend deleted.
        out[dst] = status.get(src) or None
    out["retries"] = retries(status)
    return out


def retries(rayjob_status: dict[str, Any]) -> int:
    """Retries on a new Ray cluster so far. KubeRay's status.failed counts failed attempts; a
    Failed RayJob's last failed attempt was not retried."""
    failed = int(rayjob_status.get("failed") or 0)
    return max(failed - 1, 0) if rayjob_status.get("jobDeploymentStatus") == "Failed" else failed


def was_invalid(status: Mapping[str, Any]) -> bool:
    """The spec did not parse when the status was last written."""
    conditions = status.get("conditions") or []
    return any(c.get("type") == "InvalidSpec" and c.get("status") == "True" for c in conditions)


# The operator stopped the job's RayJob itself (it was stored without Ray authentication): the
# RayJob's later states (Suspended, its cluster deleted) are not the job's.
AUTH_UNSUPPORTED = "AuthUnsupported"
# Kueue deactivated the job's Workload itself (maximum execution time, requeuing limit): the job
# failed, whatever its RayJob does next (an administrator may still re-activate the Workload).
KUEUE_DEACTIVATED = "KueueDeactivated"
_STOPPED_REASONS = frozenset({AUTH_UNSUPPORTED, KUEUE_DEACTIVATED})


def stopped_by_operator(status: Mapping[str, Any]) -> bool:
    """Failed by the operator's verdict, not its RayJob's: the RayJob's later states are not the job's."""
    return any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") in _STOPPED_REASONS
        for c in status.get("conditions") or []
    )


def finished(status: Mapping[str, Any]) -> bool:
    """Succeeded or Failed for good. A Failed for an invalid spec is re-judged on every edit."""
    return status.get("phase") in TERMINAL and not was_invalid(status)


def ended(rayjob: Mapping[str, Any]) -> bool:
    """The RayJob's (last) state ends the run: Succeeded or Failed."""
    return observe(dict(rayjob.get("status") or {})).phase in TERMINAL


class Step(enum.Enum):
    """What a handler did or saw; with `Refused` and `Failure`, the outcomes `operator_status` turns,
    with the job and its RayJob, into the status."""

    MIRRORED = "mirrored"  # the RayJob's state as it is (or its last one, before it was deleted)
    CREATED = "created"  # children created or adopted, nothing mirrored yet: the first status
    RECREATED = "recreated"  # the unfinished job's RayJob was gone and has been created again
    SYNCED = "synced"  # the spec reached children that exist; the RayJob's events report its state
    KEPT = "kept"  # a finished job stays finished: an edit is only acknowledged (observedGeneration)


@dataclass(frozen=True)
class Refused:
    """The API refused to create a child for now (quota, admission); retried after `delay` seconds."""

    error: str
    delay: float


@dataclass(frozen=True)
class Waiting:
    """A queued job cannot reach Kueue (not installed, or an API version the operator does not
    speak); looked at again after `delay` seconds."""

    problem: str
    delay: float


@dataclass(frozen=True)
class Failure:
    """A permanent failure the operator found: InvalidSpec, ChildConflict, CreateFailed or
    AuthUnsupported."""

    reason: str
    message: str


Outcome = Step | Refused | Waiting | Failure


@dataclass(frozen=True)
class Announcement:
    """An Event to post on the job: `type` Normal or Warning, a CamelCase reason, a message."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Startup:
    """What a mirror of a starting job found: its `runPolicy.startupDeadlineSeconds`, and why its
    Ray cluster has not started (None: nothing found, or not looked at)."""

    deadline_seconds: int
    diagnosis: Diagnosis | None = None


@dataclass(frozen=True)
class Report:
    """A status update (merged into the job's status) and the Event that goes with it, posted when
    `announce` says: "phase" when the write changes the phase, "write" whenever it writes, "always"
    even when the status was already so."""

    update: dict[str, Any]
    event: Announcement | None = None
    announce: Literal["phase", "write", "always"] = "phase"
    # The job failed to start in time: its RayJob must be stopped (operator/startup.py).
    stop_rayjob: bool = False


def operator_status(
    job: Mapping[str, Any],
    rayjob: Mapping[str, Any] | None,
    outcome: Outcome,
    now: str,
    startup: Startup | None = None,
) -> Report:
    """The operator's part of `job`'s status after `outcome` (`rayjob`: the job's RayJob, None when
    the outcome needs none), and its Event. Conditions keep their transition times. `startup`
    (with MIRRORED): the start-up deadline and what blocks the start."""
    status = dict(job.get("status") or {})
    generation = job["metadata"].get("generation")
    conditions = list(status.get("conditions") or [])
    if isinstance(outcome, Failure):
        conditions = invalid_spec_conditions(outcome.message, generation, conditions, now)
        if outcome.reason != "InvalidSpec":
            conditions = [
                {**c, "reason": outcome.reason} if c["type"] == "Failed" else c
                for c in conditions
                if c["type"] != "InvalidSpec"
            ]
        update = {"phase": "Failed", "message": outcome.message, "observedGeneration": generation}
        event = Announcement("Warning", outcome.reason, outcome.message)
        return Report({**update, "conditions": conditions}, event, "write")
    if isinstance(outcome, Refused):
        message = (
            f"cannot create the job's objects yet (retrying every {outcome.delay:.0f} s or sooner): "
            f"{outcome.error}"
        )
        update = {
            "phase": status.get("phase") or "Pending",
            "message": message,
            "observedGeneration": generation,
        }
        said = status.get("message")
        first = not (isinstance(said, str) and outcome.error in said)  # one Warning per refusal
        return Report(
            update, Announcement("Warning", "CreateRefused", message), "write" if first else "phase"
        )
    if isinstance(outcome, Waiting):
        message = f"waiting for Kueue (looked at again in {outcome.delay:.0f} s or sooner): {outcome.problem}"
        said = status.get("message")
        first = not (isinstance(said, str) and outcome.problem in said)  # one Warning per problem
        update = {
            "phase": status.get("phase") or "Pending",
            "message": message,
            "observedGeneration": generation,
        }
        return Report(
            update, Announcement("Warning", "KueueUnavailable", message), "write" if first else "phase"
        )
    if outcome is Step.KEPT:
        return Report({"observedGeneration": generation})
    if rayjob is None:
        raise ValueError(f"{outcome} needs the job's RayJob")
    name = rayjob["metadata"]["name"]
    if outcome is Step.SYNCED:
        cleared = clear_invalid_spec(conditions, generation, now)
        return Report({"observedGeneration": generation, "rayJobName": name, "conditions": cleared})
    if outcome is Step.CREATED:
        cleared = clear_invalid_spec(conditions, generation, now)
        update, _ = derive(rayjob, {**status, "conditions": cleared}, generation, now)
        return Report(
            update, Announcement("Normal", "Created", f"created RayJob {name} and its objects"), "write"
        )
    if outcome is Step.RECREATED:
        update, _ = derive(rayjob, status, generation, now)
        message = (
            f"RayJob {name} was deleted while the job was {status.get('phase')}; "
            "created it again: training resumes from the latest checkpoint"
        )
        return Report(update, Announcement("Warning", "RayJobRecreated", message), "always")
    if outcome is Step.MIRRORED:
        if was_invalid(status) or startup_failed(status) or stopped_by_operator(status):
            # Nothing runs: the reconciler reports the spec; a job that failed to start, or whose
            # Ray auth was dropped, stays failed while its RayJob is stopped (KubeRay's Retrying or
            # Suspending is not mirrored).
            return Report({})
        update, observed = derive(rayjob, status, generation, now)
        if finished(status) and observed.phase not in TERMINAL:
            # A finished job stays finished whatever its RayJob shows next (a RayJob stored again
            # without its status, one a user suspended after the end): a phase that is not an end
            # would let the reconciler start it again.
            return Report({})
        if startup is not None:
            started = startup_status(rayjob, status, update, observed, startup, generation, now)
            if started is not None:
                return started
        previous = status.get("phase") or "None"
        kind = "Warning" if observed.phase == "Failed" else "Normal"
        message = f"phase {previous} → {observed.phase}: {observed.message}"
        return Report(update, Announcement(kind, observed.reason, message))
    assert_never(outcome)


def startup_failed(status: Mapping[str, Any]) -> bool:
    """The job failed because it did not start within its deadline (the operator's verdict)."""
    return status.get("phase") == "Failed" and any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") == STARTUP_EXPIRED
        for c in status.get("conditions") or []
    )


def recorded_diagnosis(status: Mapping[str, Any]) -> Diagnosis | None:
    """The cause last written to the StartupBlocked condition: when the deadline passes, the pods
    that showed it may already be gone (KubeRay deletes the cluster as it retries)."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == STARTUP_CONDITION and cond.get("status") == "True":
            return Diagnosis(str(cond.get("reason")), str(cond.get("message") or ""))
    return None


def _startup_condition(
    existing: list[dict[str, Any]], diagnosis: Diagnosis | None, generation: int | None, now: str
) -> list[dict[str, Any]]:
    """StartupBlocked set to `diagnosis` (True) or cleared (False, only if it was ever written)."""
    old = next((c for c in existing if c.get("type") == STARTUP_CONDITION), None)
    if diagnosis is None and old is None:
        return existing
    status = "True" if diagnosis is not None else "False"
    cond: dict[str, Any] = {
        "type": STARTUP_CONDITION,
        "status": status,
        "reason": diagnosis.reason if diagnosis is not None else "NoCauseFound",
        "message": diagnosis.message if diagnosis is not None else "",
        "lastTransitionTime": now
        if old is None or old.get("status") != status
        else old["lastTransitionTime"],
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return [c for c in existing if c.get("type") != STARTUP_CONDITION] + [cond]


def startup_status(
    rayjob: Mapping[str, Any],
    status: Mapping[str, Any],
    update: dict[str, Any],
    observed: Observed,
    startup: Startup,
    generation: int | None,
    now: str,
) -> Report | None:
    """The mirrored status of a starting job: Failed (and its RayJob to be stopped) once the
    start-up deadline has passed; Initializing with the cause named while something blocks it;
    None when the ordinary mirror says it all."""
    diagnosis = startup.diagnosis
    if startup_expired(rayjob, startup.deadline_seconds, now):
        diagnosis = diagnosis or recorded_diagnosis(status)
        cause = diagnosis.message if diagnosis is not None else "no cause found in its pods and their Events"
        message = (
            f"the Ray cluster did not start within runPolicy.startupDeadlineSeconds "
            f"({startup.deadline_seconds} s): {cause}; its Ray cluster is stopped and the job is not retried"
        )
        conditions = conditions_for("Failed", STARTUP_EXPIRED, message, generation, update["conditions"], now)
        conditions = _startup_condition(conditions, diagnosis, generation, now)
        failed = {**update, "phase": "Failed", "message": message, "conditions": conditions}
        return Report(failed, Announcement("Warning", STARTUP_EXPIRED, message), "write", stop_rayjob=True)
    starting = observed.phase == "Initializing" and observed.reason != "Retrying"
    if starting and diagnosis is not None:
        at = deadline_at(rayjob, startup.deadline_seconds)
        until = f"; it fails at {at} if it has not started (runPolicy.startupDeadlineSeconds)" if at else ""
        message = f"{observed.message}; waiting: {diagnosis.message}{until}"
        # The mirror's conditions stand: Initializing has no condition of its own to carry the message.
        conditions = _startup_condition(update["conditions"], diagnosis, generation, now)
        previous = status.get("phase") or "None"
        event = Announcement("Warning", diagnosis.reason, f"phase {previous} → {observed.phase}: {message}")
        blocked = recorded_diagnosis(status)
        return Report(
            {**update, "message": message, "conditions": conditions},
            event,
            "write" if blocked is None or blocked.message != diagnosis.message else "phase",
        )
    # Started, or nothing found: a StartupBlocked written before turns False (in `update`, which the
    # ordinary mirror then writes).
    update["conditions"] = _startup_condition(update["conditions"], None, generation, now)
    return None
