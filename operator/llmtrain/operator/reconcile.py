"""Create, resume and update of an LLMTrainingJob: parse it, render its children, create or re-sync
them, and report what happened (`reporting.report`).

A finished job is never started again; an invalid spec or a child another owner holds fails the
job; a creation the API refuses for now (quota, admission) is retried with a growing delay.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import kopf

from llmtrain.api.validation import InvalidJob, parse_stored_job
from llmtrain.constants import KUEUE_QUEUE_LABEL
from llmtrain.operator import workload
from llmtrain.operator.children import (
    AuthDropped,
    ChildBeingReplaced,
    OwnershipConflict,
    child_key,
    ensure_all,
    sync_if_present,
)
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.kube import ApiError, Kube
from llmtrain.operator.metrics import ERRORS, PHASE_BOOK, RECONCILE_SECONDS
from llmtrain.operator.reporting import job_key, report
from llmtrain.operator.status import AUTH_UNSUPPORTED, Failure, Refused, Step, finished, was_invalid
from llmtrain.render import render


def reconcile(
    body: kopf.Body,
    status: kopf.Status,
    memo: kopf.Memo,
    logger: kopf.Logger,
    retry: int,
    **_: Any,
) -> None:
    started = time.perf_counter()
    try:
        _reconcile(memo.kube, memo.config, body, dict(status), logger, retry)
    except ApiError as err:  # a status write; the children's errors are handled inside
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
        # the RayJob if it is there.
        sync_if_present(kube, objects[-1])
        report(kube, body, None, Step.KEPT)
        return
    try:
        result = ensure_all(kube, objects)
    except ChildBeingReplaced as exc:
        logger.info(str(exc))
        raise kopf.TemporaryError(str(exc), delay=3) from exc
    except OwnershipConflict as exc:
        _fail(kube, body, "ChildConflict", str(exc))
        return
    except AuthDropped as exc:
        if KUEUE_QUEUE_LABEL in (exc.rayjob["metadata"].get("labels") or {}):
            _sync_workload(kube, exc.rayjob, active=False, logger=logger)
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
    if KUEUE_QUEUE_LABEL in (result.rayjob["metadata"].get("labels") or {}):
        _sync_workload(kube, result.rayjob, active=not job.spec.run_policy.suspend, logger=logger)
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


def recreate(kube: Kube, config: OperatorConfig, job: Mapping[str, Any], logger: Any) -> None:
    """Create an unfinished job's children again after its RayJob went; the run resumes from its
    latest checkpoint. A spec that no longer parses is left to the reconciler."""
    try:
        parsed = parse_stored_job(_document(job))
    except InvalidJob:
        return
    try:
        result = ensure_all(kube, render(parsed, config.images))
    except AuthDropped as exc:
        _fail(kube, job, AUTH_UNSUPPORTED, str(exc))
        return
    report_recreated(kube, job, result.rayjob, logger)


def report_recreated(kube: Kube, job: Mapping[str, Any], rayjob: dict[str, Any], logger: Any) -> None:
    said = report(kube, job, rayjob, Step.RECREATED)
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


def _sync_workload(kube: Kube, rayjob: dict[str, Any], *, active: bool, logger: kopf.Logger) -> None:
    """A queued job's runPolicy.suspend acts on its Kueue Workload (Kueue owns the RayJob's)."""
    try:
        if workload.set_active(kube, rayjob, active):
            logger.info(f"{'re-activated' if active else 'deactivated'} the Kueue Workload")
    except workload.WorkloadNotYet as exc:
        raise kopf.TemporaryError(str(exc), delay=2) from exc
    except ApiError as err:
        ERRORS.labels(reason=f"WorkloadHttp{err.status}").inc()
        raise kopf.TemporaryError(f"Kueue Workload: {err}", delay=err.retry_after or 5) from err


def _status_write_failed(what: str, err: ApiError) -> kopf.TemporaryError:
    """Retried soon: at once after a 409 (re-read; the mirror wrote first), else as the server says."""
    ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
    delay = 0.2 if err.status == 409 else err.retry_after or 2
    return kopf.TemporaryError(f"{what}: {err}", delay=delay)


def _refusal_backoff(retry: int) -> float:
    """5 s, 10 s, 20 s ... capped at 5 minutes: a full quota may take a while to free."""
    return float(min(300, 5 * 2 ** min(retry, 6)))
