"""The one writer of the operator's part of a job's status, and of its Events.

Every path (the reconciler's first write, the RayJob mirror, the periodic resync, refusals and
permanent failures) hands `report` what it found; `status.operator_status` computes the update and
it is written here: only if it changes something, through the status subresource (never `spec`,
never the trainer's `progress`), with the phase recorded for the `llmtrain_jobs` gauge and an Event
when the report asks for one. A job whose status is finished is labelled `llmtrain.dev/finished`
here too (`mark_finished`), which keeps it out of the resync's lists.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import socket
from collections.abc import Mapping
from typing import Any

from llmtrain.constants import (
    FINISHED_LABEL,
    GROUP_VERSION,
    KIND,
    OPERATOR_NAME,
    RAY_GROUP_VERSION,
    RAYJOB_KIND,
    RFC3339_FORMAT,
)
from llmtrain.operator.kube import RESOURCES, ApiError, Kube, Resource
from llmtrain.operator.metrics import PHASE_BOOK
from llmtrain.operator.serial import Recent
from llmtrain.operator.status import (
    Announcement,
    Outcome,
    Report,
    Startup,
    Step,
    finished,
    operator_status,
    startup_failed,
)

JOB_RESOURCE = RESOURCES[(GROUP_VERSION, KIND)]
RAYJOB_RESOURCE = RESOURCES[(RAY_GROUP_VERSION, RAYJOB_KIND)]
COMPONENT = OPERATOR_NAME
INSTANCE = socket.gethostname()  # the pod's name in a cluster
log = logging.getLogger(__name__)
FINISHED_VALUE = "true"


def rayjob_digest(rayjob: Mapping[str, Any]) -> bytes:
    """What a RayJob says to the mirror (its name, uid, labels, annotations, owners, deletion,
    spec and status), as a digest: not its resourceVersion, managedFields or finalizers, which
    change with writes that say nothing new (KubeRay adding its finalizer)."""
    meta = rayjob.get("metadata") or {}
    said = [
        meta.get(key)
        for key in ("name", "uid", "labels", "annotations", "ownerReferences", "deletionTimestamp")
    ]
    text = json.dumps([said, rayjob.get("spec"), rayjob.get("status")], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class MirroredFrom:
    """Per job (by uid), the RayJob state (`rayjob_digest`) its status was last derived from by
    this process, through `report`: the RayJob mirror skips an event that brings that same state
    again (the echo of the reconciler's own create, KubeRay's finalizer), which would cost a GET
    of the job and write nothing. Any other report on the job forgets it (its status may say
    something else now), and so does a failed write. The most recent `capacity` jobs are kept;
    a forgotten job costs one read at its RayJob's next event. The resync pass and the start-up
    look mirror from the RayJob as it is, whatever this says."""

    def __init__(self, capacity: int = 20_000) -> None:
        self._digests: Recent[bytes] = Recent(capacity)

    def note(self, job_uid: str, rayjob: Mapping[str, Any]) -> None:
        self._digests.put(job_uid, rayjob_digest(rayjob))

    def forget(self, job_uid: str) -> None:
        self._digests.forget(job_uid)

    def same(self, job_uid: str, rayjob: Mapping[str, Any]) -> bool:
        """Whether the job's status was last derived from this very RayJob state."""
        known = self._digests.get(job_uid)
        return known is not None and known == rayjob_digest(rayjob)

    def __len__(self) -> int:
        return len(self._digests)


MIRRORED_FROM = MirroredFrom()
# The outcomes whose status is the RayJob's state as given (`status.operator_status`).
_DERIVED = (Step.CREATED, Step.MIRRORED, Step.RECREATED)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime(RFC3339_FORMAT)


def job_key(meta: Mapping[str, Any]) -> str:
    return f"{meta['namespace']}/{meta['name']}"


def announce(kube: Kube, job: Mapping[str, Any], event: Announcement) -> None:
    """A core/v1 Event on the job, posted here rather than through Kopf's queue, which exists only
    in its handlers' context (the resync loop announces too). A failed post is logged, not raised:
    an Event is worth less than the status write it follows."""
    meta = job["metadata"]
    stamp = now()
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": job.get("apiVersion") or GROUP_VERSION,
            "kind": job.get("kind") or KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": INSTANCE,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        kube.create(body)
    except ApiError as err:
        log.warning(f"cannot post Event {event.reason} on {job_key(meta)}: {err}")


def report(
    kube: Kube,
    job: Mapping[str, Any],
    rayjob: Mapping[str, Any] | None,
    outcome: Outcome,
    *,
    precondition: bool = True,
    startup: Startup | None = None,
) -> Report:
    """Write the status `outcome` gives `job` (as the caller read it), and post its Event.

    The write is conditional on the job's resourceVersion (`precondition`): a status computed from
    an older copy of the job never lands (a 409; the caller reads again or leaves it to the next
    event), so a finished job cannot be written back to Running from a stale list. A job deleted
    meanwhile is not an error; any other failure raises ApiError for the caller to retry.
    """
    said = operator_status(job, rayjob, outcome, now(), startup)
    uid = job["metadata"].get("uid")
    if uid:
        MIRRORED_FROM.forget(str(uid))  # until written: a failed write leaves nothing noted
    written = _write(kube, job, said.update, precondition)
    if uid and rayjob is not None and outcome in _DERIVED:
        MIRRORED_FROM.note(str(uid), rayjob)
    merged = {**(job.get("status") or {}), **said.update}
    if finished(merged) and not startup_failed(merged):  # that one once its RayJob is stopped
        mark_finished(kube, job, merged.get("rayJobName"))
    phase = said.update.get("phase")
    if said.event is not None and (
        said.announce == "always"
        or (
            written
            and (said.announce == "write" or (phase and phase != (job.get("status") or {}).get("phase")))
        )
    ):
        announce(kube, job, said.event)
    return said


def mark_finished(kube: Kube, job: Mapping[str, Any], rayjob_name: str | None = None) -> bool:
    """Label a finished job `llmtrain.dev/finished` (once: a job that has it is left alone), and
    its RayJob (`rayjob_name`, when it has one) first: both then leave Kopf's watches and the
    resync's lists. A label is metadata: a patch of the object itself, not of its status. A
    failure is logged, not raised: the status it follows is written, and the resync labels any
    finished job it still lists. True when the job's label was written."""
    meta = job["metadata"]
    if (meta.get("labels") or {}).get(FINISHED_LABEL) == FINISHED_VALUE:
        return False
    body = {"metadata": {"labels": {FINISHED_LABEL: FINISHED_VALUE}}}
    try:
        if rayjob_name:
            _label_if_present(kube, RAYJOB_RESOURCE, meta["namespace"], rayjob_name, body)
        kube.merge_patch(JOB_RESOURCE, meta["namespace"], meta["name"], body)
    except ApiError as err:
        if err.status != 404:
            log.warning(f"cannot label {job_key(meta)} finished yet ({err}); the resync will")
        return False
    return True


def unmark_unfinished(kube: Kube, job: Mapping[str, Any]) -> None:
    """Take the finished label off a job whose status is not finished (someone else put it there):
    labelled, it would be out of Kopf's view and the resync's, and nothing would run it."""
    meta = job["metadata"]
    log.warning(f"{job_key(meta)} is labelled {FINISHED_LABEL} but has not finished: label removed")
    try:
        kube.merge_patch(
            JOB_RESOURCE, meta["namespace"], meta["name"], {"metadata": {"labels": {FINISHED_LABEL: None}}}
        )
    except ApiError as err:
        if err.status != 404:
            log.warning(f"cannot remove the label of {job_key(meta)} yet ({err}); the next resync will")


def _label_if_present(kube: Kube, res: Resource, namespace: str, name: str, body: dict[str, Any]) -> None:
    try:
        kube.merge_patch(res, namespace, name, body)
    except ApiError as err:
        if err.status != 404:
            raise


def _write(kube: Kube, job: Mapping[str, Any], update: dict[str, Any], precondition: bool) -> bool:
    """Merge `update` into the job's status; True when it was written (changed, and the job is there)."""
    meta = job["metadata"]
    current = job.get("status") or {}
    if all(current.get(key) == value for key, value in update.items()):
        return False
    body: dict[str, Any] = {"status": update}
    if precondition:
        body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
    try:
        kube.merge_patch(JOB_RESOURCE, meta["namespace"], meta["name"], body, subresource="status")
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    if update.get("phase"):
        PHASE_BOOK.set(job_key(meta), update["phase"])
    return True
