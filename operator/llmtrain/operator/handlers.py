"""Kopf handlers: thin edges that read, call the pure core (parse, render, status mapping), write.

- create / resume / update of an LLMTrainingJob → render and create-or-adopt its children;
- any event of a RayJob labelled with `llmtrain.dev/job` → mirror its status into the owner.
Deletion relies on ownerReference garbage collection: no finalizer, nothing to block.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import kopf

from llmtrain.api.spec import API_GROUP, API_VERSION, PLURAL
from llmtrain.api.validation import InvalidJob, parse_job
from llmtrain.operator import settings as operator_settings
from llmtrain.operator import status as status_map
from llmtrain.operator.children import ChildBeingReplaced, OwnershipConflict, ensure_all
from llmtrain.operator.kube import RESOURCES, ApiError, Kube
from llmtrain.operator.metrics import ERRORS, PHASE_BOOK, RECONCILE_SECONDS
from llmtrain.render import ImageSettings, render
from llmtrain.render.labels import JOB_LABEL

JOB_RESOURCE = RESOURCES[(f"{API_GROUP}/{API_VERSION}", "LLMTrainingJob")]
TRAINER_IMAGE_ENV = "LLMTRAIN_TRAINER_IMAGE"
_STATUS_ATTEMPTS = 4


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _event(body: Any, kind: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the job; posting failures are Kopf's to retry, never ours to raise."""
    kopf.event(body, type=kind, reason=reason, message=message[:1024])


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    workers = int(os.environ.get("LLMTRAIN_OPERATOR_WORKERS", "16"))
    operator_settings.configure(settings, workers=workers)
    memo.kube = Kube.from_environment(connections=workers)
    image = os.environ.get(TRAINER_IMAGE_ENV)
    memo.images = ImageSettings(trainer_image=image) if image else ImageSettings()


def _document(body: kopf.Body) -> dict[str, Any]:
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


def _patch_status(kube: Kube, namespace: str, name: str, status: dict[str, Any]) -> None:
    kube.merge_patch(JOB_RESOURCE, namespace, name, {"status": status}, subresource="status")


def _fail_permanently(
    body: kopf.Body,
    patch: kopf.Patch,
    reason: str,
    message: str,
    generation: int | None,
    existing: list[dict[str, Any]],
) -> None:
    meta = body["metadata"]
    conditions = status_map.invalid_spec_conditions(message, generation, existing, _now())
    if reason != "InvalidSpec":
        conditions = [
            {**c, "reason": reason} if c["type"] == "Failed" else c
            for c in conditions
            if c["type"] != "InvalidSpec"
        ]
    patch.status.update(
        {"phase": "Failed", "message": message, "observedGeneration": generation, "conditions": conditions}
    )
    PHASE_BOOK.set(_key(meta["namespace"], meta["name"]), "Failed")
    ERRORS.labels(reason=reason).inc()
    _event(body, "Warning", reason, message)


@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.update(API_GROUP, API_VERSION, PLURAL)
def reconcile(
    body: kopf.Body,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    retry: int,
    **_: Any,
) -> None:
    started = time.perf_counter()
    kube: Kube = memo.kube
    meta = body["metadata"]
    generation = meta.get("generation")
    existing = list(status.get("conditions") or [])
    try:
        job = parse_job(_document(body))
    except InvalidJob as exc:
        message = "invalid spec: " + "; ".join(str(p) for p in exc.problems)
        logger.warning(message)
        _fail_permanently(body, patch, "InvalidSpec", message, generation, existing)
        return
    try:
        result = ensure_all(kube, render(job, memo.images))
    except ChildBeingReplaced as exc:
        logger.info(str(exc))
        raise kopf.TemporaryError(str(exc), delay=3) from exc
    except OwnershipConflict as exc:
        _fail_permanently(body, patch, "ChildConflict", str(exc), generation, existing)
        return
    except ApiError as err:
        ERRORS.labels(reason=f"Http{err.status}").inc()
        if err.transient:
            logger.info(f"transient API error, retrying: {err}")
            raise kopf.TemporaryError(str(err), delay=err.retry_after or 2) from err
        if err.refused_for_now:
            _report_refusal(body, status, patch, err, retry, generation)
            logger.warning(str(err))
            raise kopf.TemporaryError(str(err), delay=_refusal_backoff(retry)) from err
        message = f"cannot create the job's objects: {err}"
        _fail_permanently(body, patch, "CreateFailed", message, generation, existing)
        return
    finally:
        RECONCILE_SECONDS.observe(time.perf_counter() - started)
    if result.created:
        logger.info(f"created {', '.join(result.created)}")
    if result.adopted:
        logger.info(f"adopted {', '.join(result.adopted)}")
    conditions = status_map.clear_invalid_spec(existing, generation, _now())
    # Nothing mirrored yet (a refused create may have set a Pending phase and its message).
    if not status.get("rayJobName") or (status.get("phase") == "Failed" and _was_invalid(existing)):
        _write_first_status(kube, body, result.rayjob, conditions)
        return
    update: dict[str, Any] = {
        "observedGeneration": generation,
        "rayJobName": result.rayjob["metadata"]["name"],
    }
    if conditions != existing:
        update["conditions"] = conditions
    patch.status.update(update)  # written with Kopf's own bookkeeping, in one request


def _refusal_backoff(retry: int) -> float:
    """5 s, 10 s, 20 s ... capped at 5 minutes: a full quota may take a while to free."""
    return float(min(300, 5 * 2 ** min(retry, 6)))


def _report_refusal(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, err: ApiError, retry: int, generation: Any
) -> None:
    """Say on the job why nothing runs yet, once per distinct refusal (not on every retry)."""
    delay = _refusal_backoff(retry)
    message = f"cannot create the job's objects yet (retrying every {delay:.0f} s or sooner): {err}"
    phase = status.get("phase") or "Pending"
    patch.status.update({"phase": phase, "message": message, "observedGeneration": generation})
    if str(err) not in str(status.get("message") or ""):
        _event(body, "Warning", "CreateRefused", message)


def _write_first_status(
    kube: Kube,
    body: kopf.Body,
    rayjob: dict[str, Any],
    conditions: list[dict[str, Any]],
) -> None:
    """The full mirrored status, written now and only if the job is unchanged since this handler read it.

    The RayJob's events may already have had its status mirrored (a newer state than the RayJob this
    handler created): the resourceVersion precondition then fails with 409, and the retry finds the
    phase set and writes only the reconciler's own fields.
    """
    meta = body["metadata"]
    generation = meta.get("generation")
    observed = status_map.observe(rayjob.get("status"))
    update = {
        "observedGeneration": generation,
        **status_map.mirrored_fields(rayjob),
        "phase": observed.phase,
        "message": observed.message,
        "conditions": status_map.conditions_for(
            observed.phase, observed.reason, observed.message, generation, conditions, _now()
        ),
    }
    precondition = {"resourceVersion": meta["resourceVersion"]}
    try:
        kube.merge_patch(
            JOB_RESOURCE,
            meta["namespace"],
            meta["name"],
            {"metadata": precondition, "status": update},
            subresource="status",
        )
    except ApiError as err:
        if err.status == 404:
            return  # deleted meanwhile: nothing to report on
        ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
        delay = 0.2 if err.status == 409 else err.retry_after or 2
        raise kopf.TemporaryError(f"first status write: {err}", delay=delay) from err
    PHASE_BOOK.set(_key(meta["namespace"], meta["name"]), observed.phase)
    _event(body, "Normal", "Created", f"created RayJob {update['rayJobName']} and its objects")


def _was_invalid(conditions: list[dict[str, Any]]) -> bool:
    return any(c.get("type") == "InvalidSpec" and c.get("status") == "True" for c in conditions)


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, optional=True)
def forget(meta: kopf.Meta, **_: Any) -> None:
    """Only bookkeeping; optional=True adds no finalizer, children go by garbage collection."""
    PHASE_BOOK.forget(_key(str(meta["namespace"]), str(meta["name"])))


def _owner_ref(rayjob: kopf.Body) -> dict[str, Any] | None:
    for ref in rayjob.get("metadata", {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == "LLMTrainingJob"
            and ref.get("apiVersion", "").startswith(API_GROUP)
        ):
            return dict(ref)
    return None


@kopf.on.event("ray.io", "v1", "rayjobs", labels={JOB_LABEL: kopf.PRESENT})
def mirror_rayjob_status(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Event handlers are not retried by Kopf, so transient errors are retried here."""
    if event.get("type") == "DELETED":
        return
    owner = _owner_ref(body)
    if owner is None:
        return
    namespace = body["metadata"]["namespace"]
    for attempt in range(_STATUS_ATTEMPTS):
        try:
            _mirror_once(memo.kube, body, owner, namespace)
            return
        except ApiError as err:
            ERRORS.labels(reason=f"StatusHttp{err.status}").inc()
            if not err.transient or attempt == _STATUS_ATTEMPTS - 1:
                logger.error(f"cannot mirror RayJob status to {owner['name']}: {err}")
                return
            time.sleep(err.retry_after or 0.5 * 2**attempt)


def _mirror_once(kube: Kube, rayjob: kopf.Body, owner: dict[str, Any], namespace: str) -> None:
    try:
        job = kube.get(JOB_RESOURCE, namespace, owner["name"])
    except ApiError as err:
        if err.status == 404:
            return  # the owner is gone; garbage collection takes the RayJob too
        raise
    if job["metadata"].get("uid") != owner.get("uid"):
        return
    current = job.get("status") or {}
    if _was_invalid(current.get("conditions") or []):
        return
    observed = status_map.with_root_cause(
        status_map.observe(dict(rayjob.get("status") or {})), current.get("progress")
    )
    generation = job["metadata"].get("generation")
    message = observed.message
    update: dict[str, Any] = {
        **status_map.mirrored_fields(dict(rayjob)),
        "phase": observed.phase,
        "observedGeneration": generation,
    }
    conditions = status_map.conditions_for(
        observed.phase, observed.reason, message, generation, list(current.get("conditions") or []), _now()
    )
    update["message"] = message
    update["conditions"] = conditions
    if all(current.get(k) == v for k, v in update.items()):
        return
    _patch_status(kube, namespace, owner["name"], update)
    PHASE_BOOK.set(_key(namespace, owner["name"]), observed.phase)
    if current.get("phase") != observed.phase:
        kind = "Warning" if observed.phase == "Failed" else "Normal"
        _event(
            job,
            kind,
            observed.reason,
            f"phase {current.get('phase') or 'None'} → {observed.phase}: {message}",
        )
