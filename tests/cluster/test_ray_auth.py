"""Ray authentication is never silently off. `spec.rayClusterSpec.authOptions` exists in the RayJob
CRD from KubeRay v1.5.1; an older CRD does not declare it, and the API server prunes it on create
without an error. Here the live RayJob CRD loses the field, as on a cluster running KubeRay 1.4 or
1.5.0: the operator sees the stored RayJob without it, stops the RayJob and fails the job saying why.
The CRD is put back afterwards.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.render import render

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OperatorProcess,
    apply_doc,
    cpu_job,
    get,
    items,
    job_status,
    wait_for,
    wait_phase,
)

CRD = "rayjobs.ray.io"


def _auth_path(crd: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The JSON pointer of authOptions in the served v1 schema, and its schema."""
    index = next(i for i, v in enumerate(crd["spec"]["versions"]) if v["name"] == "v1")
    cluster_spec = "/spec/versions/{}/schema/openAPIV3Schema/properties/spec/properties/rayClusterSpec"
    schema = crd["spec"]["versions"][index]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return cluster_spec.format(index) + "/properties/authOptions", schema["properties"]["rayClusterSpec"][
        "properties"
    ]["authOptions"]


@pytest.fixture
def rayjob_crd_without_auth(cluster: Cluster, platform: str, namespace: str) -> Iterator[None]:
    crd = get(cluster, "crd", CRD)
    assert crd is not None
    path, schema = _auth_path(crd)
    cluster.kubectl("patch", "crd", CRD, "--type=json", "-p", json.dumps([{"op": "remove", "path": path}]))
    try:
        yield
    finally:
        cluster.kubectl(
            "patch",
            "crd",
            CRD,
            "--type=json",
            "-p",
            json.dumps([{"op": "add", "path": path, "value": schema}]),
        )
        # The API server serves a changed CRD after a moment: the next test's RayJobs must keep
        # authOptions. Two CI runs lost it in the test that ran next, the second after a dry-run
        # create had already kept it once: so a real create, read back, must keep it three times
        # in a row, a second apart.
        kept, probes = [0], itertools.count()

        def served_again() -> bool:
            kept[0] = kept[0] + 1 if _stored_keeps_auth(cluster, namespace, next(probes)) else 0
            return kept[0] >= 3

        wait_for(served_again, timeout=120, interval=1, what="authOptions served again (3 creates in a row)")


def _probe_rayjob(name: str, namespace: str) -> dict[str, Any]:
    """The RayJob a suspended job of that name renders, with authOptions, owned by nothing."""
    (probe,) = [o for o in render(parse_job(cpu_job(name, namespace, suspend=True))) if o["kind"] == "RayJob"]
    probe["metadata"].pop("ownerReferences", None)
    assert probe["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    return probe


def _stored_keeps_auth(cluster: Cluster, namespace: str, attempt: int) -> bool:
    """A suspended probe RayJob created for real and read back keeps authOptions; then deleted."""
    probe = _probe_rayjob(f"auth-probe-{attempt}", namespace)
    cluster.kubectl("create", "--validate=false", "-n", namespace, "-f", "-", input=json.dumps(probe))
    try:
        stored = get(cluster, "rayjobs.ray.io", probe["metadata"]["name"], namespace)
        return stored is not None and "authOptions" in stored["spec"]["rayClusterSpec"]
    finally:
        args = ("delete", "rayjobs.ray.io", probe["metadata"]["name"], "-n", namespace, "--wait=false")
        cluster.kubectl(*args, check=False)


def _prunes_auth(cluster: Cluster, namespace: str) -> bool:
    """Whether the API server, as it serves the RayJob CRD now, drops authOptions on create."""
    probe = _probe_rayjob("probe", namespace)
    # --validate=false: kubectl's default (Strict) refuses what the API server would prune.
    args = ("create", "--dry-run=server", "--validate=false", "-n", namespace, "-o", "json", "-f", "-")
    dry = cluster.kubectl(*args, input=json.dumps(probe))
    return "authOptions" not in json.loads(dry.stdout)["spec"]["rayClusterSpec"]


@pytest.mark.usefixtures("jobs_deleted_first", "rayjob_crd_without_auth")
def test_a_rayjob_stored_without_auth_is_stopped_and_the_job_fails_naming_kuberay(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    # The API server prunes the field from now on (a changed CRD is served after a moment).
    wait_for(lambda: _prunes_auth(cluster, namespace), what="authOptions pruned by the API server")

    apply_doc(cluster, cpu_job("open", namespace))
    status = wait_phase(cluster, namespace, "open", "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "AuthUnsupported", status
    assert "KubeRay v1.5.1" in status["message"] and "authOptions" in status["message"], status
    rayjob = get(cluster, "rayjob", "open", namespace)
    assert rayjob is not None and rayjob["spec"]["suspend"] is True
    assert "authOptions" not in rayjob["spec"]["rayClusterSpec"]
    wait_for(lambda: not items(cluster, "rayclusters", namespace), what="no Ray cluster left")
    events = [e for e in items(cluster, "events", namespace) if e.get("reason") == "AuthUnsupported"]
    assert events and events[0]["type"] == "Warning"
    # The suspended RayJob's later states are not the job's: it stays Failed, and an edit of the
    # job does not resume its RayJob.
    patch = {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 60}}}
    cluster.kubectl("patch", "llmtj", "open", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    time.sleep(5)
    assert job_status(cluster, namespace, "open")["phase"] == "Failed"
    rayjob = get(cluster, "rayjob", "open", namespace)
    assert rayjob is not None and rayjob["spec"]["suspend"] is True
