"""`llmtrain operator` as it runs in its pod, against the real API server: liveness and metrics
endpoints, JSON logs naming the object, the trainer image it is configured with, and a namespace
scope that leaves other namespaces' jobs alone. The session's all-namespace operator is stopped
meanwhile, so what happens to a job is this process's doing.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    cpu_job,
    get,
    start_operator,
    wait_for,
    wait_phase,
)

IMAGE = "registry.example/trainer:9"


def _port(op: OperatorProcess, flag: str) -> int:
    return int(next(a for a in op.argv if a.startswith(f"--{flag}=")).split("=", 1)[1])


def _get(url: str) -> tuple[int, str]:
    """(status, body); (0, '') while nothing listens yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except OSError:
        return 0, ""


@pytest.mark.usefixtures("jobs_deleted_first")
def test_scoped_operator_probes_metrics_json_logs_and_image(
    cluster: Cluster, operator: OperatorProcess, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    operator.stop()
    scoped = start_operator(
        cluster,
        tmp_path,
        "scoped",
        log_format="json",
        args=("--namespace", namespace, "--trainer-image", IMAGE),
    )
    try:
        liveness, metrics = _port(scoped, "liveness-port"), _port(scoped, "metrics-port")
        wait_for(lambda: _get(f"http://127.0.0.1:{liveness}/healthz")[0] == 200, what="liveness")
        apply_doc(cluster, cpu_job("proc", namespace, suspend=True))
        apply_doc(cluster, cpu_job("ignored", other_namespace, suspend=True))
        wait_phase(cluster, namespace, "proc", "Suspended")
        rayjob = get(cluster, "rayjob", "proc", namespace)
        assert rayjob is not None
        head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert head["containers"][0]["image"] == IMAGE
        body = wait_for(
            lambda: (
                (text := _get(f"http://127.0.0.1:{metrics}/metrics")[1])
                and 'llmtrain_jobs{phase="Suspended"} 1.0' in text
                and text
            ),
            what="the jobs gauge",
        )
        # One reconcile, or two when the RayJob's state was mirrored first and the reconciler's
        # conditional first write met a 409 and ran again (see test_faults.py).
        count = re.search(r"^llmtrain_reconcile_duration_seconds_count (\S+)$", body, re.MULTILINE)
        assert count is not None and float(count.group(1)) in (1.0, 2.0), body[-2000:]
        assert "llmtrain_errors_total" in body
        # Scoped: the other namespace's job is not even given a status.
        assert get(cluster, "rayjob", "ignored", other_namespace) is None
        assert not (get(cluster, "llmtj", "ignored", other_namespace) or {}).get("status")
    finally:
        scoped.stop()
        operator.start()
    records = [json.loads(line) for line in scoped.output().splitlines() if line.startswith("{")]
    assert records, scoped.output()[-2000:]
    assert any(r.get("object", {}).get("name") == "proc" for r in records)
    # The all-namespace operator picks up what the scoped one left alone.
    wait_phase(cluster, other_namespace, "ignored", "Suspended")


def _gauge(metrics_port: int, phase: str) -> float | None:
    """The `llmtrain_jobs` gauge's value for `phase`; None while the endpoint does not answer."""
    text = _get(f"http://127.0.0.1:{metrics_port}/metrics")[1]
    found = re.search(rf'^llmtrain_jobs{{phase="{phase}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


@pytest.mark.usefixtures("jobs_deleted_first")
def test_the_jobs_gauge_drops_a_deleted_job_and_is_rebuilt_after_a_restart(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """No resync within the test (an hour): the deleted job leaves the gauge on its DELETED event,
    and after a restart the gauge counts the jobs from their status.phase, written by no one."""
    operator.stop()
    scoped = start_operator(cluster, tmp_path, "gauge", args=("--namespace", namespace), resync_seconds=3600)
    try:
        metrics = _port(scoped, "metrics-port")
        for name in ("kept", "deleted"):
            apply_doc(cluster, cpu_job(name, namespace, suspend=True))
        for name in ("kept", "deleted"):
            wait_phase(cluster, namespace, name, "Suspended")
        wait_for(lambda: _gauge(metrics, "Suspended") == 2.0, what="two Suspended jobs on the gauge")

        cluster.kubectl("delete", "llmtj", "deleted", "-n", namespace, "--wait=true")
        wait_for(
            lambda: _gauge(metrics, "Suspended") == 1.0, timeout=30, what="the deleted job off the gauge"
        )

        scoped.restart()
        wait_for(lambda: _gauge(metrics, "Suspended") == 1.0, what="the gauge rebuilt after the restart")
        assert all(_gauge(metrics, phase) == 0.0 for phase in ("Pending", "Running", "Succeeded", "Failed"))
    finally:
        scoped.stop()
        operator.start()
