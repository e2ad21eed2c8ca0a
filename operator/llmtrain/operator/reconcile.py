"""Create, resume and update of an LLMTrainingJob: parse it, render its children, create or re-sync
them, and report what happened (`reporting.report`).

A finished job is never started again; an invalid spec or a child another owner holds fails the
job; a creation the API refuses for now (quota, admission), or children an earlier job of this name
left behind, wait with a growing delay; pods an earlier job of this name left (terminating)
hold the RayJob back until they are gone. Each run holds the job's lock (`serial.JOB_LOCKS`), and the
job is read again just before its RayJob would be created: Kopf's copy may be older than a finish
the mirror has written meanwhile. Not on a first try that created every earlier child itself
(`children.ensure_all`): no RayJob of the job can have been made before, so nothing finished it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from llmtrain.api.validation import InvalidJob, parse_stored_job
from llmtrain.operator import startup, workload
from llmtrain.operator.children import (
    AuthDropped,
    ChildBeingReplaced,
    EarlierPodsRemain,
    LeftByEarlierJob,
    OwnershipConflict,
    child_key,
    ensure_all,
    kueue_owns_suspend,
    sync_if_present,
)
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.kube import ApiError, Kube
from llmtrain.operator.metrics import ERRORS, PHASE_BOOK, RECONCILE_SECONDS
from llmtrain.operator.reporter import REPORTER_RBAC
from llmtrain.operator.reporting import JOB_RESOURCE, job_key, mark_finished, report
from llmtrain.operator.serial import JOB_LOCKS, Recent
from llmtrain.operator.status import (
    AUTH_UNSUPPORTED,
    KUEUE_DEACTIVATED,
    Failure,
    Refused,
    Step,
    Waiting,
    finished,
    startup_failed,
    was_invalid,
)
from llmtrain.render import render

# How often a job whose namesake's pods are still going looks again (their grace period is 30 s).
EARLIER_PODS_DELAY = 5.0


class TriedJobs:
    """The uids of the jobs this process has already tried to reconcile, the most recent
    `capacity`: a job's first try creates its children without reading them first
    (`children.ensure_all(create_first=True)`), and Kopf can run the create handler of a job again
    with the same cause and retry count (its diff base patch not yet back through the watch), when
    every create would conflict. Forgetting an old uid only costs that job a conflict per child."""

    def __init__(self, capacity: int = 20_000) -> None:
        self._uids: Recent[None] = Recent(capacity)

    def first(self, uid: str) -> bool:
        """True the first time `uid` is seen (and from then on remembered)."""
        return self._uids.put(uid, None)


TRIED = TriedJobs()


def first_try(reason: str, retry: int, status: Mapping[str, Any], uid: str) -> bool:
    """A job's children are created without reading them first only on its very first try: Kopf's
    create cause (never resume: after a restart the children exist), no retry, nothing in its status,
    and not tried by this process yet. An interrupted first try (the operator killed in it) looks
    the same to a new process: its children then answer 409 and are read, as on any other try."""
    fresh = reason == "create" and retry == 0 and not status.get("rayJobName") and not status.get("phase")
    return TRIED.first(uid) and fresh


def reconcile(
    body: kopf.Body,
    status: kopf.Status,
    memo: kopf.Memo,
    logger: kopf.Logger,
    retry: int,
    reason: str = "",
    **_: Any,
) -> None:
    started = time.perf_counter()
    try:
        with JOB_LOCKS.hold(job_key(body["metadata"])):
            create_first = first_try(str(reason), retry, status, str(body["metadata"].get("uid")))
            _reconcile(memo.kube, memo.config, body, dict(status), logger, retry, create_first)
    except ApiError as err:  # a status write (409: the job changed since read); children's inside
        raise _status_write_failed("status write", err) from err
    finally:
        RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _reconcile(
    kube: Kube,
    config: OperatorConfig,
    body: kopf.Body,
    status: dict[str, Any],
    logger: kopf.Logger,
    retry: int,
    create_first: bool = False,
) -> None:
    if status.get("phase"):
        PHASE_BOOK.set(job_key(body["metadata"]), status["phase"])  # the gauge again after a restart
    try:
        job = parse_stored_job(_document(body))
    except InvalidJob as exc:
        message = "invalid spec: " + "; ".join(str(p) for p in exc.problems)
        logger.warning(message)
        _fail(kube, body, "InvalidSpec", message)
        return
    objects = render(job, config.images)
    if finished(status):
        # Never started again, whatever became of its RayJob; an edit (e.g. its TTL) still reaches
        # the RayJob if it is there, except for a job that failed to start: its RayJob stays
        # stopped (and is stopped again here, after a restart, if that did not get through).
        if startup_failed(status):
            stored = sync_if_present(kube, startup.stopped(objects[-1]))
            if stored is not None:
                startup.stop(kube, stored)
            mark_finished(kube, body, status.get("rayJobName"))  # only once it is stopped
        else:
            sync_if_present(kube, objects[-1])
        report(kube, body, None, Step.KEPT)
        return
    try:
        # The namespace's reporter rights before the job's pods can run (its trainer reports with them).
        for written in REPORTER_RBAC.ensure(kube, job.metadata.namespace):
            logger.info(f"{written} (the reporter rights of namespace {job.metadata.namespace})")
        result = ensure_all(
            kube, objects, still_unfinished(kube, body), _kueue_manages(kube), create_first=create_first
        )
    except JobStopped as exc:  # finished (or went) since Kopf read it: nothing starts again
        if exc.job is not None:
            report(kube, exc.job, None, Step.KEPT)
        return
    except LeftByEarlierJob as exc:
        logger.warning(str(exc))
        delay = _refusal_backoff(retry)
        report(kube, body, None, Refused(str(exc), delay))
        raise kopf.TemporaryError(str(exc), delay=delay) from exc
    except ChildBeingReplaced as exc:
        logger.info(str(exc))
        raise kopf.TemporaryError(str(exc), delay=3) from exc
    except EarlierPodsRemain as exc:  # terminating pods go within their grace period
        logger.info(str(exc))
        report(kube, body, None, Refused(str(exc), EARLIER_PODS_DELAY))
        raise kopf.TemporaryError(str(exc), delay=EARLIER_PODS_DELAY) from exc
    except OwnershipConflict as exc:
        _fail(kube, body, "ChildConflict", str(exc))
        return
    except AuthDropped as exc:
        if kueue_owns_suspend(exc.rayjob):
            _sync_workload(kube, body, exc.rayjob, active=False, logger=logger, retry=retry)
        _fail(kube, body, AUTH_UNSUPPORTED, str(exc))
        return
    except ApiError as err:
        ERRORS.labels(reason=f"Http{err.status}").inc()
        if err.transient:
            logger.info(f"transient API error, retrying: {err}")
            raise kopf.TemporaryError(str(err), delay=err.retry_after or 2) from err
        if err.refused_for_now:
            logger.warning(str(err))
            delay = _refusal_backoff(retry)
            report(kube, body, None, Refused(str(err), delay))
            raise kopf.TemporaryError(str(err), delay=delay) from err
        _fail(kube, body, "CreateFailed", f"cannot create the job's objects: {err}")
        return
    if kueue_owns_suspend(result.rayjob):
        left = _sync_workload(
            kube, body, result.rayjob, active=not job.spec.run_policy.suspend, logger=logger, retry=retry
        )
        if left is not None and left.by_kueue:
            # Kueue's verdict (maximum execution time, requeuing limit) ends the job.
            _fail(kube, body, KUEUE_DEACTIVATED, left.describe())
            return
        if left is not None:
            logger.warning(left.describe())
    if result.created:
        logger.info(f"created {', '.join(result.created)}")
    if result.adopted:
        logger.info(f"adopted {', '.join(result.adopted)}")
    if not status.get("rayJobName") or was_invalid(status):
        # Nothing mirrored yet (a refused create may have set a Pending phase and its message).
        # Written only if the job is unchanged since this handler read it: the RayJob's events may
        # already have had a newer state mirrored, which then wins (409, and the retry lands here
        # no more).
        try:
            report(kube, body, result.rayjob, Step.CREATED, precondition=True)
        except ApiError as err:
            raise _status_write_failed("first status write", err) from err
    elif child_key(result.rayjob) in result.created:
        # Named in the status, yet created now: it was deleted while no handler was watching (the
        # operator down, a missed event). Said on purpose, as when the deletion is seen.
        report_recreated(kube, body, result.rayjob, logger)
    else:
        report(kube, body, result.rayjob, Step.SYNCED)


class JobStopped(Exception):
    """The job finished (`job`: as it is now) or went (None) since it was read: start nothing."""

    def __init__(self, job: dict[str, Any] | None) -> None:
        super().__init__("the job finished or went since it was read")
        self.job = job


def read_again(kube: Kube, job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job as stored now; None when it is gone, being deleted, or a namesake (another uid)."""
    meta = job["metadata"]
    try:
        now = kube.get(JOB_RESOURCE, meta["namespace"], meta["name"])
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    if now["metadata"].get("uid") != meta.get("uid") or now["metadata"].get("deletionTimestamp"):
        return None
    return now


def still_unfinished(kube: Kube, job: Mapping[str, Any]) -> Callable[[dict[str, Any]], None]:
    """The check before a RayJob is created (which starts training): raise JobStopped if the job,
    read again, has finished or gone."""

    def check(_rayjob: dict[str, Any]) -> None:
        now = read_again(kube, job)
        if now is None or finished(now.get("status") or {}):
            raise JobStopped(now)

    return check


def _kueue_manages(kube: Kube) -> Callable[[dict[str, Any]], bool]:
    """Whether Kueue manages a RayJob without a queue label: a Workload of it exists."""

    def check(rayjob: dict[str, Any]) -> bool:
        return workload.manages(kube, rayjob)

    return check


def recreate(kube: Kube, config: OperatorConfig, job: Mapping[str, Any], logger: Any) -> None:
    """Create an unfinished job's children again after its RayJob went; the run resumes from its
    latest checkpoint. A spec that no longer parses is left to the reconciler; a job that finished
    or went meanwhile is left alone."""
    try:
        parsed = parse_stored_job(_document(job))
    except InvalidJob:
        return
    try:
        REPORTER_RBAC.ensure(kube, parsed.metadata.namespace)
        result = ensure_all(
            kube, render(parsed, config.images), still_unfinished(kube, job), _kueue_manages(kube)
        )
    except JobStopped:
        return
    except EarlierPodsRemain as exc:  # the next resync pass looks again
        logger.info(str(exc))
        return
    except AuthDropped as exc:
        _fail(kube, job, AUTH_UNSUPPORTED, str(exc))
        return
    report_recreated(kube, job, result.rayjob, logger)


def report_recreated(kube: Kube, job: Mapping[str, Any], rayjob: dict[str, Any], logger: Any) -> None:
    """Said once, on purpose: a job that changed since read (409) is read again and told, since
    the RayJob exists by now and no later pass would see it recreated."""
    try:
        said = report(kube, job, rayjob, Step.RECREATED)
    except ApiError as err:
        if err.status != 409:
            raise
        now = read_again(kube, job)
        if now is None:  # gone meanwhile: nothing to tell
            return
        said = report(kube, now, rayjob, Step.RECREATED)
    if said.event is not None:
        logger.warning(said.event.message)


def _document(body: Mapping[str, Any]) -> dict[str, Any]:
    """The job as a plain dict, without status (parse only what the user wrote)."""
    meta = body.get("metadata", {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "generation": meta.get("generation"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": dict(body.get("spec") or {}),
    }


def _fail(kube: Kube, job: Mapping[str, Any], reason: str, message: str) -> None:
    """A permanent failure: phase Failed, a condition and a Warning naming the cause."""
    ERRORS.labels(reason=reason).inc()
    report(kube, job, None, Failure(reason, message))


def _sync_workload(
    kube: Kube,
    job: Mapping[str, Any],
    rayjob: dict[str, Any],
    *,
    active: bool,
    logger: kopf.Logger,
    retry: int,
) -> workload.Deactivation | None:
    """A queued job's runPolicy.suspend acts on its Kueue Workload (Kueue owns the RayJob's); a
    Workload someone else deactivated is left so, and returned. Without a Workload API to speak
    (no Kueue, or an unknown version), the job says so and is looked at again with a growing delay."""
    try:
        synced = workload.set_active(kube, rayjob, active)
    except workload.WorkloadNotYet as exc:
        raise kopf.TemporaryError(str(exc), delay=2) from exc
    except workload.KueueUnavailable as exc:
        ERRORS.labels(reason="KueueUnavailable").inc()
        delay = _refusal_backoff(retry)
        report(kube, job, None, Waiting(str(exc), delay))
        raise kopf.TemporaryError(str(exc), delay=delay) from exc
    except ApiError as err:
        ERRORS.labels(reason=f"WorkloadHttp{err.status}").inc()
        if err.transient:
            raise kopf.TemporaryError(f"Kueue Workload: {err}", delay=err.retry_after or 2) from err
        delay = _refusal_backoff(retry)
        report(kube, job, None, Waiting(f"cannot reach its Kueue Workload: {err}", delay))
        raise kopf.TemporaryError(f"Kueue Workload: {err}", delay=delay) from err
    if synced.changed:
        logger.info(f"{'re-activated' if active else 'deactivated'} the Kueue Workload")
    return synced.deactivation


def _status_write_failed(what: str, err: ApiError) -> kopf.TemporaryError:
    """Retried soon: at once after a 409 (re-read; the mirror wrote first), else as the server says."""
    ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
    delay = 0.2 if err.status == 409 else err.retry_after or 2
    return kopf.TemporaryError(f"{what}: {err}", delay=delay)


def _refusal_backoff(retry: int) -> float:
    """5 s, 10 s, 20 s ... capped at 5 minutes: a full quota may take a while to free."""
    return float(min(300, 5 * 2 ** min(retry, 6)))
