"""Jobs kept after they finish cost the operator nothing: it labels a finished job
`llmtrain.dev/finished`, and its resync asks the API server only for jobs without that label, a
page at a time, and for the RayJobs of the unfinished jobs it got. Judged from the API server's
audit log (the request URIs the operator sent), on the real API server's label selectors."""

from __future__ import annotations

import time
import urllib.parse

import pytest
from llmtrain.constants import FINISHED_LABEL, JOB_LABEL

from tests.support.cluster import audit
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OPERATOR_USER,
    RESYNC_SECONDS,
    OperatorProcess,
    apply_doc,
    cpu_job,
    finish_job,
    get,
    items,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.usefixtures("jobs_deleted_first")


def _labels(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    return dict(((get(cluster, "llmtj", name, namespace) or {}).get("metadata") or {}).get("labels") or {})


def _query(call: audit.Call) -> dict[str, str]:
    return {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(call.uri).query).items()}


def test_a_finished_job_is_labelled_and_the_resync_lists_neither_it_nor_its_rayjob(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply_doc(cluster, cpu_job("retained-done", namespace))
    apply_doc(cluster, cpu_job("retained-live", namespace))
    finish_job(cluster, namespace, "retained-done")
    wait_for(
        lambda: _labels(cluster, namespace, "retained-done").get(FINISHED_LABEL) == "true",
        what="the finished job labelled",
    )
    wait_phase(cluster, namespace, "retained-live", "Running")
    assert FINISHED_LABEL not in _labels(cluster, namespace, "retained-live")
    # The server's own filter: the selector the resync sends leaves out the finished job only.
    listed = {o["metadata"]["name"] for o in items(cluster, "llmtj", namespace, f"!{FINISHED_LABEL}")}
    assert listed == {"retained-live"}

    # A finished job without the label (finished under an older operator) gets it back.
    cluster.kubectl("label", "llmtj", "retained-done", "-n", namespace, f"{FINISHED_LABEL}-")
    mark = audit.size(cluster.audit_log)
    wait_for(
        lambda: _labels(cluster, namespace, "retained-done").get(FINISHED_LABEL) == "true",
        timeout=3 * RESYNC_SECONDS,
        what="the label written again",
    )
    time.sleep(2 * RESYNC_SECONDS)  # at least one resync pass after the mark
    calls = audit.calls(cluster.audit_log, OPERATOR_USER, mark)
    job_lists = [_query(c) for c in calls if c.verb == "list" and c.resource == "llmtrainingjobs"]
    assert job_lists, "no resync pass listed the jobs"
    assert all(q.get("labelSelector") == f"!{FINISHED_LABEL}" and q.get("limit") for q in job_lists), (
        job_lists
    )
    rayjob_lists = [_query(c) for c in calls if c.verb == "list" and c.resource == "rayjobs"]
    assert rayjob_lists, "no resync pass listed the unfinished job's RayJob"
    for query in rayjob_lists:
        selector = query.get("labelSelector", "")
        assert selector.startswith(f"{JOB_LABEL} in ("), query
        names = selector.removeprefix(f"{JOB_LABEL} in (").removesuffix(")").split(",")
        assert "retained-live" in names and "retained-done" not in names, query
    assert get(cluster, "llmtj", "retained-done", namespace)["status"]["phase"] == "Succeeded"
