"""A job's status from its RayJob: on every RayJob event (`mirror_rayjob`), and again in a periodic
level-triggered pass (`resync_all`), so missed events and failed writes converge.

A RayJob deleted under a running job is created again (the run resumes from its checkpoint); one
deleted under a finished job is not: a finished job stays finished. Both paths hold the job's lock
(`serial.JOB_LOCKS`) and write only over the job as they read it (a conditional write): the resync
acts on a list that may be a pass old, so it reads the job again before anything that starts work,
and leaves a job that changed since it was listed to the events that changed it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from llmtrain.constants import (
    API_GROUP,
    FINISHED_LABEL,
    JOB_LABEL,
    KIND,
    RAY_GROUP_VERSION,
    RAYJOB_KIND,
    UNFINISHED_SELECTOR,
)
from llmtrain.operator import startup
from llmtrain.operator.children import ChildBeingReplaced, LeftByEarlierJob, OwnershipConflict
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.kube import RESOURCES, ApiError, Kube
from llmtrain.operator.metrics import ERRORS, PHASE_BOOK, RESYNC
from llmtrain.operator.reconcile import read_again, recreate
from llmtrain.operator.reporter import REPORTER_RBAC
from llmtrain.operator.reporting import (
    JOB_RESOURCE,
    MIRRORED_FROM,
    job_key,
    mark_finished,
    report,
    unmark_unfinished,
)
from llmtrain.operator.serial import JOB_LOCKS
from llmtrain.operator.status import Step, ended, finished, startup_failed

RAYJOB_RESOURCE = RESOURCES[(RAY_GROUP_VERSION, RAYJOB_KIND)]
# Quick retries of a failed mirror write inside the event handler; the resync pass does the rest.
_MIRROR_ATTEMPTS = 3
# The resync's job list: only jobs not labelled finished (`reporting.mark_finished`), a page at a time.
UNFINISHED = UNFINISHED_SELECTOR
# Jobs per page: a page's job names make the label selector of its RayJob list (at most 47
# characters each, so a few kilobytes of URL).
RESYNC_PAGE = 100
# Label patches in flight at once at start-up (at most --workers, the API connections pooled).
LABEL_CONCURRENCY = 8


def mirror_rayjob(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Event handlers are not retried by Kopf: a few quick retries here (each reads the job again:
    a 409 means it changed since read), then the resync pass. An event that brings the RayJob
    state the job's status was last derived from (`reporting.MIRRORED_FROM`) is skipped: it would
    read the job and write nothing."""
    ref = owner_ref(body)
    if ref is None:
        return
    with JOB_LOCKS.hold(job_key({"namespace": body["metadata"]["namespace"], "name": ref["name"]})):
        if event.get("type") != "DELETED" and MIRRORED_FROM.same(str(ref.get("uid")), body):
            return
        for attempt in range(_MIRROR_ATTEMPTS):
            try:
                job = _owner(memo.kube, body)
                if job is None:
                    return
                if event.get("type") == "DELETED":
                    rayjob_gone(memo.kube, memo.config, job, body, logger)
                else:
                    startup.mirror(memo.kube, job, body)
                return
            except ApiError as err:
                MIRRORED_FROM.forget(str(ref.get("uid")))  # its stop may not have got through
                ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
                if not err.transient or attempt == _MIRROR_ATTEMPTS - 1:
                    name = body["metadata"]["name"]
                    logger.warning(f"cannot mirror RayJob {name} yet ({err}); resync will")
                    return
                time.sleep(err.retry_after or 0.5 * 2**attempt)


def owner_ref(rayjob: Mapping[str, Any]) -> dict[str, Any] | None:
    """The controller reference to an LLMTrainingJob, if the RayJob has one."""
    for ref in rayjob.get("metadata", {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == KIND
            and ref.get("apiVersion", "").startswith(API_GROUP)
        ):
            return dict(ref)
    return None


def _owner(kube: Kube, rayjob: Mapping[str, Any]) -> dict[str, Any] | None:
    """The live job that controls this RayJob; None if gone, being deleted, or a namesake."""
    ref = owner_ref(rayjob)
    if ref is None:
        return None
    try:
        job = kube.get(JOB_RESOURCE, rayjob["metadata"]["namespace"], ref["name"])
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    if job["metadata"].get("uid") != ref.get("uid") or job["metadata"].get("deletionTimestamp"):
        return None
    return job


def rayjob_gone(
    kube: Kube, config: OperatorConfig, job: dict[str, Any], last: Mapping[str, Any] | None, logger: Any
) -> None:
    """The job's RayJob was deleted (by a person, a script, or KubeRay after it finished); `last`:
    its final state, when the deletion was seen rather than inferred from a list (then `job`, from
    the list, is read again first: it may have finished since)."""
    if last is None:
        now = read_again(kube, job)
        if now is None:
            return
        job = now
    status = job.get("status") or {}
    if finished(status) or not status.get("rayJobName"):
        return
    if last is not None:
        if ended(last):  # it finished, then went: report the end
            report(kube, job, last, Step.MIRRORED)
            return
    else:
        try:  # seen missing in a list: make sure before creating it again
            kube.get(RAYJOB_RESOURCE, job["metadata"]["namespace"], str(status["rayJobName"]))
            return
        except ApiError as err:
            if err.status != 404:
                raise
    recreate(kube, config, job, logger)


def resync_forever(kube: Kube, config: OperatorConfig, stop: threading.Event) -> None:
    """The resync pass every `resync_seconds`; between passes, the start-up pass every
    `startup_look_seconds`."""
    logger = logging.getLogger("llmtrain.resync")
    next_resync = time.monotonic() + config.resync_seconds
    try:  # the finished jobs on the gauge now, not a resync period after a start
        count_finished(kube, config)
    except Exception:
        logger.exception("counting the finished jobs failed; the resync pass counts them again")
    while not stop.wait(max(0.0, min(config.startup_look_seconds, next_resync - time.monotonic()))):
        try:
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + config.resync_seconds
                with RESYNC.timed():
                    resync_all(kube, config, logger)
            else:
                look_at_starting(kube, logger)
        except Exception:  # never let the loop die; the next period tries again
            logger.exception("resync failed")


def look_at_starting(kube: Kube, logger: logging.Logger) -> None:
    """The start-up pass: each job the mirror last saw starting, mirrored again (under its lock)
    from its RayJob as it is now, so what keeps it waiting shows within seconds, not at the next
    resync. Two GETs per starting job; a job that is gone, finished or no longer owns the RayJob
    leaves the set."""
    for key, (namespace, name, rayjob_name) in startup.STARTING.items():
        try:
            with JOB_LOCKS.hold(key):
                job = kube.get(JOB_RESOURCE, namespace, name)
                rayjob = kube.get(RAYJOB_RESOURCE, namespace, rayjob_name)
                owned = (owner_ref(rayjob) or {}).get("uid") == job["metadata"].get("uid")
                if not owned or finished(job.get("status") or {}) or job["metadata"].get("deletionTimestamp"):
                    startup.STARTING.forget(key)
                    continue
                startup.mirror(kube, job, rayjob)
        except ApiError as err:
            if err.status == 404:
                startup.STARTING.forget(key)
                continue
            ERRORS.labels(reason=f"StartupLookHttp{err.status}").inc()
            logger.warning(f"start-up look at {key}: {err}")


def resync_all(kube: Kube, config: OperatorConfig, logger: logging.Logger) -> None:
    """Level-triggered: every unfinished job's status from its RayJob as it is now, whatever events
    were missed or writes failed; a RayJob that is gone is created again.

    Bounded by the jobs at work, not by every job ever kept: the API server leaves out jobs
    labelled finished (`UNFINISHED`), and each page of jobs is handled (its RayJobs listed by job
    name) before the next is asked for. A finished job still listed (its label write failed, or
    it finished under an older operator, or its label was removed) is labelled here. Jobs are
    listed before their RayJobs, so a RayJob a listed job names (created before its name was
    written) is in the second list unless it was deleted. Then the finished jobs are counted for
    the gauge, a page at a time (`PhaseBook.count_retained`); a job in neither list (its DELETED
    event missed) leaves the gauge."""
    booked = PHASE_BOOK.keys()  # before listing: a job created later is not dropped
    REPORTER_RBAC.forget()  # each namespace with a job at work is read again (one deleted: made again)
    listed: set[str] = set()
    for namespace in config.namespaces or (None,):
        for jobs in kube.list_pages(JOB_RESOURCE, namespace, label_selector=UNFINISHED, page=RESYNC_PAGE):
            listed.update(job_key(job["metadata"]) for job in jobs)
            _resync_page(kube, config, namespace, jobs, logger)
    retained = count_finished(kube, config)
    PHASE_BOOK.forget(*(booked - listed - retained))


def count_finished(kube: Kube, config: OperatorConfig) -> set[str]:
    """The jobs labelled finished, by phase, for the gauge (`PhaseBook.count_retained`): Kopf does
    not see them. A page at a time, so kept jobs cost one page of memory. A job labelled so whose
    status has not finished (someone else labelled it) has the label taken off, or nothing would
    ever run it. The keys counted are returned."""
    retained: dict[str, str] = {}
    for namespace in config.namespaces or (None,):
        for jobs in kube.list_pages(JOB_RESOURCE, namespace, label_selector=FINISHED_LABEL, page=RESYNC_PAGE):
            for job in jobs:
                status = job.get("status") or {}
                if finished(status):
                    retained[job_key(job["metadata"])] = str(status["phase"])
                elif not job["metadata"].get("deletionTimestamp"):
                    unmark_unfinished(kube, job)
    PHASE_BOOK.count_retained(retained)
    return set(retained)


def edit_pending(job: Mapping[str, Any]) -> bool:
    """An edit the operator has not acted on yet (generation past status.observedGeneration): a
    finished job edited while unlabelled stays unlabelled, and so in Kopf's view, until it has."""
    generation = job["metadata"].get("generation")
    observed = (job.get("status") or {}).get("observedGeneration")
    return generation is not None and observed is not None and generation != observed


def label_finished_jobs(kube: Kube, config: OperatorConfig, logger: logging.Logger) -> None:
    """Before Kopf's first LIST (run by the start-up handler): each finished job not labelled yet
    (finished under an older operator) is labelled, a page at a time, so Kopf never lists or holds
    it; a job that failed to start has its RayJob stopped first. Kopf hands every object of its
    LIST to a worker of its own at once, so after an upgrade it would otherwise hold every job
    kept. Each page's patches run `LABEL_CONCURRENCY` at a time (one after the other, 5,000 jobs
    took minutes, and Kopf served no job meanwhile); a job's own patches stay in order, RayJob
    first. A failure is logged: the resync pass labels what is left."""
    width = max(1, min(LABEL_CONCURRENCY, config.workers))
    try:
        with ThreadPoolExecutor(max_workers=width, thread_name_prefix="llmtrain-label") as pool:
            for namespace in config.namespaces or (None,):
                pages = kube.list_pages(JOB_RESOURCE, namespace, label_selector=UNFINISHED, page=RESYNC_PAGE)
                for jobs in pages:
                    due = [job for job in jobs if _label_due(job)]
                    for done in [pool.submit(_label_one, kube, job) for job in due]:
                        done.result()  # the page done before the next is listed: one page held
    except ApiError as err:
        logger.warning(f"labelling the finished jobs at start-up: {err}; the resync pass goes on")


def _label_due(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    return not job["metadata"].get("deletionTimestamp") and finished(status) and not edit_pending(job)


def _label_one(kube: Kube, job: Mapping[str, Any]) -> None:
    status = job.get("status") or {}
    if startup_failed(status):
        startup.stop_and_mark(kube, job)
    else:
        mark_finished(kube, job, status.get("rayJobName"))


def _resync_page(
    kube: Kube,
    config: OperatorConfig,
    namespace: str | None,
    jobs: list[dict[str, Any]],
    logger: logging.Logger,
) -> None:
    """One page of listed jobs: finished ones labelled, the others resynced from their RayJobs."""
    active: list[dict[str, Any]] = []
    for job in jobs:
        status = job.get("status") or {}
        if job["metadata"].get("deletionTimestamp"):
            continue
        if finished(status) and edit_pending(job):
            continue  # left in Kopf's view until the edit is observed (then `report` labels it)
        if startup_failed(status):
            try:
                startup.stop_and_mark(kube, job)
            except ApiError as err:  # the next pass tries again
                logger.warning(f"stopping the RayJob of {job_key(job['metadata'])}: {err}")
        elif finished(status):
            mark_finished(kube, job, status.get("rayJobName"))
        elif status.get("rayJobName"):
            active.append(job)
    if not active:
        return
    for ns in sorted({job["metadata"]["namespace"] for job in active}):
        try:
            REPORTER_RBAC.ensure(kube, ns)
        except (ApiError, OwnershipConflict) as exc:  # the jobs' reconciles say so; the next pass retries
            logger.warning(f"the reporter rights of namespace {ns}: {exc}")
    names = ",".join(sorted({job["metadata"]["name"] for job in active}))
    rayjobs = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r
        for r in kube.list_all(RAYJOB_RESOURCE, namespace, label_selector=f"{JOB_LABEL} in ({names})")
    }
    for job in active:
        meta, status = job["metadata"], job["status"]
        try:
            with JOB_LOCKS.hold(job_key(meta)):
                _resync_one(
                    kube, config, job, rayjobs.get((meta["namespace"], str(status["rayJobName"]))), logger
                )
        except ApiError as err:
            if err.status == 409:  # the job changed since it was listed: its own events report it
                continue
            ERRORS.labels(reason=f"ResyncHttp{err.status}").inc()
            logger.warning(f"resync of {job_key(meta)}: {err}")
        except (ChildBeingReplaced, OwnershipConflict, LeftByEarlierJob) as exc:  # this job's trouble
            logger.warning(f"resync of {job_key(meta)}: {exc}")


def _resync_one(
    kube: Kube,
    config: OperatorConfig,
    job: dict[str, Any],
    rayjob: dict[str, Any] | None,
    logger: logging.Logger,
) -> None:
    """One listed job, under its lock: its status from its listed RayJob (written only if the job is
    still as listed), or, its RayJob missing from the list, `rayjob_gone` (which reads both again)."""
    if rayjob is None:
        rayjob_gone(kube, config, job, None, logger)
    elif (owner_ref(rayjob) or {}).get("uid") == job["metadata"].get("uid"):
        startup.mirror(kube, job, rayjob)
