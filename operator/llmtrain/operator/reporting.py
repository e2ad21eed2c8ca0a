"""The one writer of the operator's part of a job's status, and of its Events.

Every path (the reconciler's first write, the RayJob mirror, the periodic resync, refusals and
permanent failures) derives a status update and hands it here: written only if it changes
something, through the status subresource (never `spec`, never the trainer's `progress`), with the
phase recorded for the `llmtrain_jobs` gauge and an Event when the phase changes.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtrain.constants import GROUP_VERSION, KIND, OPERATOR_NAME
from llmtrain.operator.kube import RESOURCES, ApiError, Kube
from llmtrain.operator.metrics import PHASE_BOOK

JOB_RESOURCE = RESOURCES[(GROUP_VERSION, KIND)]
COMPONENT = OPERATOR_NAME
INSTANCE = socket.gethostname()  # the pod's name in a cluster
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Announcement:
    """An Event to post on the job: `type` Normal or Warning, a CamelCase reason, a message."""

    type: str
    reason: str
    message: str


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def write_status(
    kube: Kube,
    job: Mapping[str, Any],
    update: dict[str, Any],
    *,
    event: Announcement | None = None,
    always_announce: bool = False,
    precondition: bool = False,
) -> bool:
    """Merge `update` into `job`'s status (as read by the caller); True when it was written.

    `event` is posted when the phase changes (or always, with `always_announce`). `precondition`
    makes the write conditional on the job being unchanged since it was read: a 409 then means
    someone (the mirror) wrote first, and the caller re-reads. A job deleted meanwhile is not an
    error (False); any other failure raises ApiError for the caller to retry.
    """
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
    phase = update.get("phase")
    if phase:
        PHASE_BOOK.set(job_key(meta), phase)
    if event is not None and (always_announce or (phase and phase != current.get("phase"))):
        announce(kube, job, event)
    return True
