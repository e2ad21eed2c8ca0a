"""Jobs kept after they finish cost the operator nothing: it labels a finished job
`llmtrain.dev/finished`, and its resync asks the API server only for jobs without that label, a
page at a time, and for the RayJobs of the unfinished jobs it got. Judged from the API server's
audit log (the request URIs the operator sent), on the real API server's label selectors."""

from __future__ import annotations

import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

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
    start_operator,
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
    # Every list of jobs is paged and filtered: the unfinished ones (Kopf's and the resync's), or
    # the finished ones the resync counts for the gauge.
    assert all(
        q.get("labelSelector") in (f"!{FINISHED_LABEL}", FINISHED_LABEL) and q.get("limit") for q in job_lists
    ), job_lists
    rayjob_lists = [_query(c) for c in calls if c.verb == "list" and c.resource == "rayjobs"]
    assert rayjob_lists, "no resync pass listed the unfinished job's RayJob"
    for query in rayjob_lists:
        selector = query.get("labelSelector", "")
        assert selector.startswith(f"{JOB_LABEL} in ("), query
        names = selector.removeprefix(f"{JOB_LABEL} in (").removesuffix(")").split(",")
        assert "retained-live" in names and "retained-done" not in names, query
    assert get(cluster, "llmtj", "retained-done", namespace)["status"]["phase"] == "Succeeded"


def _gauge(port: int, phase: str) -> float | None:
    """The `llmtrain_jobs` gauge for `phase`; None while the endpoint does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.search(rf'^llmtrain_jobs{{phase="{phase}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_a_job_out_of_kopfs_view_stays_counted_and_finished_when_its_label_is_removed(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """Kopf watches only jobs without the finished label (server-side selector), so labelling a
    job finished reaches Kopf as a DELETED event: the job stays on the gauge. After a restart the
    gauge counts it at once (the operator counts the finished jobs as it starts). A user (or a
    GitOps tool re-applying its manifest) removing the label and editing the spec brings the job
    back into Kopf's view: it stays Succeeded, its RayJob is not replaced, and it is labelled
    again. No resync pass runs within the test (an hour)."""
    operator.stop()
    scoped = start_operator(
        cluster, tmp_path, "retained", args=("--namespace", namespace), resync_seconds=3600
    )
    try:
        port = int(next(a for a in scoped.argv if a.startswith("--metrics-port=")).split("=", 1)[1])
        apply_doc(cluster, cpu_job("kept-done", namespace))
        finish_job(cluster, namespace, "kept-done")
        wait_for(lambda: _labels(cluster, namespace, "kept-done").get(FINISHED_LABEL) == "true", what="label")
        rayjob = get(cluster, "rayjob", "kept-done", namespace)
        assert (rayjob["metadata"].get("labels") or {}).get(FINISHED_LABEL) == "true", "its RayJob labelled"
        time.sleep(2)  # the DELETED event Kopf got for the job leaving its view has been handled
        assert _gauge(port, "Succeeded") == 1.0, "a job out of Kopf's view is still counted"

        scoped.restart()
        wait_for(lambda: _gauge(port, "Succeeded") == 1.0, what="the finished job counted after a restart")

        # A GitOps re-apply: the label gone, an edit to the spec (its Ray cluster's TTL).
        cluster.kubectl("label", "llmtj", "kept-done", "-n", namespace, f"{FINISHED_LABEL}-")
        cluster.kubectl(
            "patch", "llmtj", "kept-done", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"runPolicy": {"ttlSecondsAfterFinished": 600}}}',
        )  # fmt: skip
        wait_for(
            lambda: _labels(cluster, namespace, "kept-done").get(FINISHED_LABEL) == "true",
            timeout=30,
            what="the job back in Kopf's view labelled again (no resync pass)",
        )
        job = get(cluster, "llmtj", "kept-done", namespace)
        assert job["status"]["phase"] == "Succeeded"
        now = get(cluster, "rayjob", "kept-done", namespace)
        assert now["metadata"]["uid"] == rayjob["metadata"]["uid"], "no RayJob made again"
        assert now["spec"]["ttlSecondsAfterFinished"] == 600, "the edit reached the RayJob while in view"
        assert _gauge(port, "Succeeded") == 1.0 and _gauge(port, "Running") == 0.0
    finally:
        scoped.stop()
        operator.start()
