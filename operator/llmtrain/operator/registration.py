"""Kopf handlers, registered explicitly (`register`) on the registry `main` builds: thin edges that
read, call the pure core (parse, render, `status.operator_status`) and write through
`reporting.report`.

- create / resume / update of an LLMTrainingJob → `reconcile`: render and create (or re-sync) its
  children;
- any event of a RayJob labelled with `llmtrain.dev/job` → `mirror`: re-derive the owner's status;
- a resync loop (every `resync_seconds`) → `mirror.resync_all`: the same from each RayJob as it is
  now, so missed events and failed writes converge.

Deletion relies on ownerReference garbage collection: no finalizer, nothing to block; a job's
DELETED event (and the resync pass, for one missed) only takes it off the `llmtrain_jobs` gauge,
unless the job is still stored (it left Kopf's view with its finished label).
Configuration arrives as one `OperatorConfig` in Kopf's memo.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Any

import kopf

from llmtrain.constants import (
    API_GROUP,
    API_VERSION,
    JOB_LABEL,
    PLURAL,
    RAY_API_GROUP,
    RAY_API_VERSION,
    RAYJOB_PLURAL,
)
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.kube import ApiError, Kube
from llmtrain.operator.metrics import PHASE_BOOK
from llmtrain.operator.mirror import label_finished_jobs, mirror_rayjob, resync_forever
from llmtrain.operator.reconcile import read_again, reconcile
from llmtrain.operator.reporting import job_key


def register(registry: kopf.OperatorRegistry) -> None:
    # Kopf adds its login to its default registry only: credentials as the kubernetes client finds
    # them (in a pod its ServiceAccount, elsewhere $KUBECONFIG).
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(startup)
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(API_GROUP, API_VERSION, PLURAL, registry=registry)(reconcile)
    kopf.on.event(API_GROUP, API_VERSION, PLURAL, when=deleted, registry=registry)(forget_deleted)
    kopf.on.event(
        RAY_API_GROUP, RAY_API_VERSION, RAYJOB_PLURAL, labels={JOB_LABEL: kopf.PRESENT}, registry=registry
    )(mirror_rayjob)
    kopf.on.cleanup(registry=registry)(cleanup)


def startup(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """The API client; finished jobs an older operator left unlabelled labelled, before Kopf's
    watches start (`mirror.label_finished_jobs`); and the resync loop in its own thread. Not a
    Kopf timer: those put a finalizer on every object, and one LIST of jobs and of RayJobs per
    period costs less than a GET per job. The thread runs in this handler's context, where Kopf's
    Event queue is known."""
    config: OperatorConfig = memo.config
    memo.kube = Kube.from_environment(connections=config.workers)
    label_finished_jobs(memo.kube, config, logging.getLogger("llmtrain.startup"))
    memo.resync_stop = threading.Event()
    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run,
        args=(resync_forever, memo.kube, config, memo.resync_stop),
        name="llmtrain-resync",
        daemon=True,
    )
    thread.start()


def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.resync_stop.set()


def deleted(type: str, **_: Any) -> bool:
    """Kopf's filter for `forget_deleted`: a DELETED event only. Without it Kopf ran the handler for
    every event of every job (~6 a job in a burst: its create, each status write, Kopf's diff base),
    each a hop to a handler thread and an INFO line, to return at once."""
    return type == "DELETED"


def forget_deleted(event: kopf.RawEvent, meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    """A deleted job leaves the `llmtrain_jobs` gauge. Not a `kopf.on.delete` handler: with no
    finalizer (children go by garbage collection) Kopf sees a deletion as GONE, which runs no
    changing handler. A DELETED event missed meanwhile is made up for by the resync pass.

    Kopf watches only unfinished jobs (settings.py), so a job labelled finished leaves its view
    as a DELETED event too (the API server sends the object as it was before the label). Such a
    job is still stored: read again, it stays on the gauge among the finished ones. Kopf calls it
    for DELETED events only (`deleted`, its registration's filter)."""
    key = job_key(meta)
    try:
        stored = read_again(memo.kube, event["object"])
    except ApiError:  # cannot tell now: the resync pass counts the finished jobs as stored
        stored = None
    phase = ((stored or {}).get("status") or {}).get("phase")
    if stored is not None and phase:
        PHASE_BOOK.retain(key, str(phase))
    else:
        PHASE_BOOK.forget(key)
