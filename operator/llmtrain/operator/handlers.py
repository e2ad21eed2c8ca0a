"""Kopf handlers: thin edges that read, call the pure core (parse, render, status derivation), write.

- create / resume / update of an LLMTrainingJob → render and create (or re-sync) its children;
- any event of a RayJob labelled with `llmtrain.dev/job` → re-derive the owner's status from it;
- a resync loop (every `resync_seconds`) → the same from each RayJob as it is now, so missed
  events and failed writes converge; a RayJob deleted under a running job is created again (the
  run resumes from its checkpoint), one deleted under a finished job is not: a finished job stays
  finished.
Deletion relies on ownerReference garbage collection: no finalizer, nothing to block; a job's
DELETED event (and the resync pass, for one missed) only takes it off the `llmtrain_jobs` gauge.

Handlers are registered explicitly (`register`) on the registry `main` builds; configuration
arrives as one `OperatorConfig` in Kopf's memo. Every status write goes through
`reporting.write_status`.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf

from llmtrain.api.validation import InvalidJob, parse_job
from llmtrain.constants import API_GROUP, API_VERSION, JOB_LABEL, KIND, KUEUE_QUEUE_LABEL, PLURAL
from llmtrain.operator import status as status_map
from llmtrain.operator import workload
from llmtrain.operator.children import (
    ChildBeingReplaced,
    OwnershipConflict,
    child_key,
    ensure_all,
    sync_if_present,
)
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.kube import RESOURCES, ApiError, Kube
from llmtrain.operator.metrics import ERRORS, PHASE_BOOK, RECONCILE_SECONDS
from llmtrain.operator.reporting import (
    JOB_RESOURCE,
    Announcement,
    announce,
    job_key,
    now,
    write_status,
)
from llmtrain.render import render

RAYJOB_RESOURCE = RESOURCES[("ray.io/v1", "RayJob")]
# Quick retries of a failed mirror write inside the event handler; the resync timer does the rest.
_MIRROR_ATTEMPTS = 3


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    # Kopf adds its login to its default registry only: credentials as the kubernetes client finds
    # them (in a pod its ServiceAccount, elsewhere $KUBECONFIG).
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(startup)
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(API_GROUP, API_VERSION, PLURAL, registry=registry)(reconcile)
    kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry)(forget_deleted)
    kopf.on.event("ray.io", "v1", "rayjobs", labels={JOB_LABEL: kopf.PRESENT}, registry=registry)(
        mirror_rayjob
    )
    kopf.on.cleanup(registry=registry)(cleanup)


def startup(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """The API client, and the resync loop in its own thread. Not a Kopf timer: those put a
    finalizer on every object, and one LIST of jobs and of RayJobs per period costs less than a
    GET per job. The thread runs in this handler's context, where Kopf's Event queue is known."""
    config: OperatorConfig = memo.config
    memo.kube = Kube.from_environment(connections=config.workers)
    memo.resync_stop = threading.Event()
    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run,
        args=(_resync_forever, memo.kube, config, memo.resync_stop),
        name="llmtrain-resync",
        daemon=True,
    )
    thread.start()


def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.resync_stop.set()


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


def _was_invalid(conditions: list[dict[str, Any]]) -> bool:
    return any(c.get("type") == "InvalidSpec" and c.get("status") == "True" for c in conditions)


def _finished(status: Mapping[str, Any]) -> bool:
    """Succeeded or Failed for good. A Failed for an invalid spec is re-judged on every edit."""
    return status.get("phase") in status_map.TERMINAL and not _was_invalid(
        list(status.get("conditions") or [])
    )


def _fail(kube: Kube, job: Mapping[str, Any], reason: str, message: str) -> None:
    """A permanent failure: phase Failed, a condition and a Warning naming the cause."""
    meta = job["metadata"]
    generation = meta.get("generation")
    existing = list((job.get("status") or {}).get("conditions") or [])
    conditions = status_map.invalid_spec_conditions(message, generation, existing, now())
    if reason != "InvalidSpec":
        conditions = [
            {**c, "reason": reason} if c["type"] == "Failed" else c
            for c in conditions
            if c["type"] != "InvalidSpec"
        ]
    update = {
        "phase": "Failed",
        "message": message,
        "observedGeneration": generation,
        "conditions": conditions,
    }
    ERRORS.labels(reason=reason).inc()
    write_status(kube, job, update, event=Announcement("Warning", reason, message), always_announce=True)


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
        ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
        delay = 0.2 if err.status == 409 else err.retry_after or 2
        raise kopf.TemporaryError(f"status write: {err}", delay=delay) from err
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
    meta = body["metadata"]
    generation = meta.get("generation")
    if status.get("phase"):
        PHASE_BOOK.set(job_key(meta), status["phase"])  # the gauge again after a restart
    try:
        job = parse_job(_document(body))
    except InvalidJob as exc:
        message = "invalid spec: " + "; ".join(str(p) for p in exc.problems)
        logger.warning(message)
        _fail(kube, body, "InvalidSpec", message)
        return
    objects = render(job, config.images)
    if _finished(status):
        # Never started again, whatever became of its RayJob; an edit (e.g. its TTL) still reaches
        # the RayJob if it is there.
        sync_if_present(kube, objects[-1])
        write_status(kube, body, {"observedGeneration": generation})
        return
    try:
        result = ensure_all(kube, objects)
    except ChildBeingReplaced as exc:
        logger.info(str(exc))
        raise kopf.TemporaryError(str(exc), delay=3) from exc
    except OwnershipConflict as exc:
        _fail(kube, body, "ChildConflict", str(exc))
        return
    except ApiError as err:
        ERRORS.labels(reason=f"Http{err.status}").inc()
        if err.transient:
            logger.info(f"transient API error, retrying: {err}")
            raise kopf.TemporaryError(str(err), delay=err.retry_after or 2) from err
        if err.refused_for_now:
            logger.warning(str(err))
            _report_refusal(kube, body, err, retry)
            raise kopf.TemporaryError(str(err), delay=_refusal_backoff(retry)) from err
        _fail(kube, body, "CreateFailed", f"cannot create the job's objects: {err}")
        return
    if KUEUE_QUEUE_LABEL in (result.rayjob["metadata"].get("labels") or {}):
        _sync_workload(kube, result.rayjob, active=not job.spec.run_policy.suspend, logger=logger)
    if result.created:
        logger.info(f"created {', '.join(result.created)}")
    if result.adopted:
        logger.info(f"adopted {', '.join(result.adopted)}")
    conditions = status_map.clear_invalid_spec(list(status.get("conditions") or []), generation, now())
    rayjob_name = result.rayjob["metadata"]["name"]
    if not status.get("rayJobName") or _was_invalid(list(status.get("conditions") or [])):
        # Nothing mirrored yet (a refused create may have set a Pending phase and its message).
        # Written only if the job is unchanged since this handler read it: the RayJob's events may
        # already have had a newer state mirrored, which then wins (409, and the retry lands here
        # no more).
        update, _ = status_map.derive(result.rayjob, {**status, "conditions": conditions}, generation, now())
        created = Announcement("Normal", "Created", f"created RayJob {rayjob_name} and its objects")
        try:
            write_status(kube, body, update, event=created, always_announce=True, precondition=True)
        except ApiError as err:
            ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
            delay = 0.2 if err.status == 409 else err.retry_after or 2
            raise kopf.TemporaryError(f"first status write: {err}", delay=delay) from err
        return
    if child_key(result.rayjob) in result.created:
        # Named in the status, yet created now: it was deleted while no handler was watching (the
        # operator down, a missed event). Said on purpose, as when the deletion is seen.
        _report_recreated(kube, dict(body), result.rayjob, logger)
        return
    write_status(
        kube, body, {"observedGeneration": generation, "rayJobName": rayjob_name, "conditions": conditions}
    )


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


def _refusal_backoff(retry: int) -> float:
    """5 s, 10 s, 20 s ... capped at 5 minutes: a full quota may take a while to free."""
    return float(min(300, 5 * 2 ** min(retry, 6)))


def _report_refusal(kube: Kube, body: kopf.Body, err: ApiError, retry: int) -> None:
    """Say on the job why nothing runs yet; one Warning per distinct refusal, not per retry."""
    status = body.get("status") or {}
    delay = _refusal_backoff(retry)
    message = f"cannot create the job's objects yet (retrying every {delay:.0f} s or sooner): {err}"
    update = {
        "phase": status.get("phase") or "Pending",
        "message": message,
        "observedGeneration": body["metadata"].get("generation"),
    }
    first = str(err) not in str(status.get("message") or "")
    write_status(
        kube, body, update, event=Announcement("Warning", "CreateRefused", message), always_announce=first
    )


def forget_deleted(event: kopf.RawEvent, meta: kopf.Meta, **_: Any) -> None:
    """A deleted job leaves the `llmtrain_jobs` gauge. Not a `kopf.on.delete` handler: with no
    finalizer (children go by garbage collection) Kopf sees a deletion as GONE, which runs no
    changing handler. A DELETED event missed meanwhile is made up for by the resync pass."""
    if event.get("type") == "DELETED":
        PHASE_BOOK.forget(job_key(meta))


def _owner_ref(rayjob: Mapping[str, Any]) -> dict[str, Any] | None:
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
    ref = _owner_ref(rayjob)
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


def _mirror(kube: Kube, job: dict[str, Any], rayjob: Mapping[str, Any]) -> None:
    status = job.get("status") or {}
    if _was_invalid(list(status.get("conditions") or [])):
        return  # nothing runs; the reconciler reports the spec
    update, observed = status_map.derive(dict(rayjob), status, job["metadata"].get("generation"), now())
    write_status(kube, job, update, event=_transition(status, observed))


def _transition(status: Mapping[str, Any], observed: status_map.Observed) -> Announcement:
    """The Event of a phase change the RayJob caused: a Warning when it failed."""
    kind = "Warning" if observed.phase == "Failed" else "Normal"
    message = f"phase {status.get('phase') or 'None'} → {observed.phase}: {observed.message}"
    return Announcement(kind, observed.reason, message)


def _rayjob_gone(
    kube: Kube, config: OperatorConfig, job: dict[str, Any], last: Mapping[str, Any] | None, logger: Any
) -> None:
    """The job's RayJob was deleted (by a person, a script, or KubeRay after it finished)."""
    status = job.get("status") or {}
    if _finished(status) or not status.get("rayJobName"):
        return
    if last is not None:
        update, observed = status_map.derive(dict(last), status, job["metadata"].get("generation"), now())
        if observed.phase in status_map.TERMINAL:  # it finished, then went: report the end
            write_status(kube, job, update, event=_transition(status, observed))
            return
    else:
        try:  # seen missing in a list: make sure before creating it again
            kube.get(RAYJOB_RESOURCE, job["metadata"]["namespace"], str(status["rayJobName"]))
            return
        except ApiError as err:
            if err.status != 404:
                raise
    try:
        parsed = parse_job(_document(job))
    except InvalidJob:
        return
    result = ensure_all(kube, render(parsed, config.images))
    _report_recreated(kube, job, result.rayjob, logger)


def _report_recreated(kube: Kube, job: dict[str, Any], rayjob: dict[str, Any], logger: Any) -> None:
    """A Warning that an unfinished job's RayJob was created again, and its status from the new one."""
    status = job.get("status") or {}
    message = (
        f"RayJob {rayjob['metadata']['name']} was deleted while the job was {status.get('phase')}; "
        "created it again: training resumes from the latest checkpoint"
    )
    logger.warning(message)
    announce(kube, job, Announcement("Warning", "RayJobRecreated", message))
    update, _ = status_map.derive(rayjob, status, job["metadata"].get("generation"), now())
    write_status(kube, job, {**update, "observedGeneration": job["metadata"].get("generation")})


def mirror_rayjob(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Event handlers are not retried by Kopf: a few quick retries here, then the resync timer."""
    for attempt in range(_MIRROR_ATTEMPTS):
        try:
            job = _owner(memo.kube, body)
            if job is None:
                return
            if event.get("type") == "DELETED":
                _rayjob_gone(memo.kube, memo.config, job, body, logger)
            else:
                _mirror(memo.kube, job, body)
            return
        except ApiError as err:
            ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
            if not err.transient or attempt == _MIRROR_ATTEMPTS - 1:
                logger.warning(f"cannot mirror RayJob {body['metadata']['name']} yet ({err}); resync will")
                return
            time.sleep(err.retry_after or 0.5 * 2**attempt)


def _resync_forever(kube: Kube, config: OperatorConfig, stop: threading.Event) -> None:
    logger = logging.getLogger("llmtrain.resync")
    while not stop.wait(config.resync_seconds):
        try:
            resync_all(kube, config, logger)
        except Exception:  # never let the loop die; the next period tries again
            logger.exception("resync failed")


def resync_all(kube: Kube, config: OperatorConfig, logger: logging.Logger) -> None:
    """Level-triggered: every unfinished job's status from its RayJob as it is now, whatever events
    were missed or writes failed; a RayJob that is gone is created again. Jobs are listed before
    RayJobs, so a RayJob a listed job names (created before its name was written) is in the second
    list unless it was deleted. The gauge forgets jobs no longer listed (a DELETED event missed)."""
    booked = PHASE_BOOK.keys()  # before listing: a job created after the lists is not dropped
    listed: set[str] = set()
    for namespace in config.namespaces or (None,):
        jobs = kube.list_all(JOB_RESOURCE, namespace)
        listed.update(job_key(job["metadata"]) for job in jobs)
        rayjobs = {
            (r["metadata"]["namespace"], r["metadata"]["name"]): r
            for r in kube.list_all(RAYJOB_RESOURCE, namespace, label_selector=JOB_LABEL)
        }
        for job in jobs:
            status = job.get("status") or {}
            meta = job["metadata"]
            if _finished(status) or not status.get("rayJobName") or meta.get("deletionTimestamp"):
                continue
            try:
                rayjob = rayjobs.get((meta["namespace"], str(status["rayJobName"])))
                if rayjob is None:
                    _rayjob_gone(kube, config, job, None, logger)
                elif (_owner_ref(rayjob) or {}).get("uid") == meta.get("uid"):
                    _mirror(kube, job, rayjob)
            except ApiError as err:
                ERRORS.labels(reason=f"ResyncHttp{err.status}").inc()
                logger.warning(f"resync of {job_key(meta)}: {err}")
            except (ChildBeingReplaced, OwnershipConflict) as exc:  # one job's trouble, not the pass's
                logger.warning(f"resync of {job_key(meta)}: {exc}")
    PHASE_BOOK.forget(*(booked - listed))
