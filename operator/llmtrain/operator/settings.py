"""Kopf settings: where its bookkeeping lives and how it retries.

Kopf's progress and diff base go to `status.kopf` (the CRD preserves unknown fields there), so the
operator writes no annotations and never touches `spec`: Argo CD and Flux see no drift. No
handler needs a finalizer, so deleting a job never waits for the operator.

Kopf sees only what is at work: its LIST and WATCH of jobs and of RayJobs carry a server-side
label selector that leaves out those labelled `llmtrain.dev/finished` (`reporting.mark_finished`),
and its LISTs come a page at a time. Jobs kept for their history then cost the operator nothing,
however many there are. A job that gets the label leaves Kopf's view as a DELETED watch event
(`registration.forget_deleted` tells that from a deletion); one whose label is removed comes back
as an ADDED event, is still finished by its status, and is labelled again.
"""

from __future__ import annotations

import logging

import kopf

from llmtrain.constants import (
    API_GROUP,
    API_VERSION,
    JOB_LABEL,
    PLURAL,
    RAY_API_GROUP,
    RAY_API_VERSION,
    RAYJOB_PLURAL,
    UNFINISHED_SELECTOR,
)
from llmtrain.operator.config import DEFAULT_WORKERS

FINALIZER = f"{API_GROUP}/operator"
# Objects per page of Kopf's LISTs (jobs, RayJobs, CRDs): one page of bodies held at a time.
LIST_CHUNK = 500
# How long Kopf waits for its own status patch (the diff base) to come back through the watch
# before it acts on the older copy it has. Kopf's default, 5 s, is shorter than the watch's lag
# under a burst of creates: the copy without the diff base then reads as never handled, and the
# create handler ran a second time for most jobs (every child read again, ~1.9 GETs per child in
# `make bench-operator`). Only a job whose patched version never arrives (a watch re-listed past
# it) waits this long for its next change handler.
CONSISTENCY_TIMEOUT = 60.0


def configure(
    settings: kopf.OperatorSettings, workers: int = DEFAULT_WORKERS, *, clusterwide: bool = True
) -> None:
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.lastHandled")
    settings.persistence.finalizer = FINALIZER
    settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT
    # Events: the handlers' explicit ones (phase transitions, errors) plus warnings and errors logged
    # on a job. Kopf's default (INFO) would also post every info line, ~7 Events per job created.
    settings.posting.level = logging.WARNING
    # Cluster-wide, Kopf watches CRDs and re-reads API discovery for a group whenever one of its
    # CRDs changes (kopf/_core/reactor/observation.py), so a CRD installed after the operator
    # (KubeRay's rayjobs, or llmtrain's own, e.g. by a GitOps tool syncing in another order) is
    # served once it is established, without a restart. A watchNamespaces install has no
    # cluster-wide rights to watch CRDs: it resolves resources once, at start-up.
    settings.scanning.disabled = not clusterwide
    settings.execution.max_workers = workers
    # Transient API errors inside Kopf itself (its own patches, watches): short, bounded backoff.
    settings.networking.error_backoffs = [0.5, 1, 2, 4, 8, 15, 30]
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.chunk_size = LIST_CHUNK
    # Server-side, on Kopf's LIST and WATCH alike (kopf/_cogs/clients/fetching.py, watching.py).
    # The RayJob handler's own filter (the job label) is said here too, so the server applies it.
    settings.watching.label_selectors[API_GROUP, API_VERSION, PLURAL] = UNFINISHED_SELECTOR
    settings.watching.label_selectors[RAY_API_GROUP, RAY_API_VERSION, RAYJOB_PLURAL] = (
        f"{JOB_LABEL},{UNFINISHED_SELECTOR}"
    )
