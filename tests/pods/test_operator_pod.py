"""The chart's operator as a pod from its image (issue #21, scenario 1), not a local process.

The cluster tier runs `llmtrain operator` on the host and leaves the chart's Deployment to kwok, so
only here do the image's entrypoint, the restricted securityContext (read-only root, UID 1000), the
startup probe, the in-cluster ServiceAccount config and the metrics Service meet a real container:
the pod becomes Ready, takes the leader Lease, serves /metrics through its Service, and reconciles a
job applied in another namespace into a RayJob it owns (RBAC and the watch from inside the pod).
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.pods.conftest import Release, busybox_pod, get
from tests.support.cluster import node
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import RELEASE, apply_doc, cpu_job, wait_for, wait_phase

OPERATOR = f"{RELEASE}-operator"
METRICS_PORT = 9090
SUSPENDED_GAUGE = 'llmtrain_jobs{phase="Suspended"} 1.0'


def _job_namespace(cluster: Cluster, platform: str) -> str:
    name = f"{platform[:50]}-jobs"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}])
    return name


def _scraper(namespace: str, url: str) -> dict[str, Any]:
    """A restricted busybox pod on the real node printing `url` once it shows SUSPENDED_GAUGE (or
    its last answer after a minute). No `wget -T`: Debian's static busybox crashes with it."""
    script = (
        f"for i in $(seq 60); do m=$(wget -q -O - {url} 2>&1); "
        f'case "$m" in *\'{SUSPENDED_GAUGE}\'*) break;; esac; sleep 1; done; echo "$m"'
    )
    return busybox_pod("scraper", namespace, script)


def test_chart_runs_the_operator_image_as_a_pod_that_leads_serves_metrics_and_reconciles(
    cluster: Cluster, release: Release
) -> None:
    # The release namespace enforces the restricted Pod Security profile: the Deployment's pod is
    # admitted only with the chart's securityContext.
    started = time.monotonic()
    namespace = release.namespace
    jobs = _job_namespace(cluster, namespace)
    try:
        pods = json.loads(
            cluster.kubectl(
                "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=operator", "-o", "json"
            ).stdout
        )["items"]
        (pod,) = pods
        assert pod["spec"]["nodeName"] == node.NODE_NAME, pod["spec"].get("nodeName")
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready.get("Ready") == "True", pod["status"]
        (container,) = pod["status"]["containerStatuses"]
        assert container["restartCount"] == 0, container
        name = pod["metadata"]["name"]

        # The chart's --leader-elect: the Lease in the release namespace names this pod.
        def holder() -> str:
            lease = cluster.kubectl("get", "lease", OPERATOR, "-n", namespace, "-o", "json", check=False)
            if lease.returncode != 0:
                return ""
            return str(json.loads(lease.stdout)["spec"].get("holderIdentity") or "")

        wait_for(
            lambda: holder().startswith(f"{name}_"), what=f"Lease {OPERATOR} held by {name}", timeout=120
        )

        # The pod's in-cluster config, RBAC and watch: a job elsewhere becomes a RayJob it owns.
        apply_doc(cluster, cpu_job("inpod", jobs, suspend=True))
        wait_phase(cluster, jobs, "inpod", "Suspended", "Pending", timeout=180)
        job = get(cluster, "llmtj", "inpod", jobs)
        rayjobs = wait_for(
            lambda: json.loads(cluster.kubectl("get", "rayjobs", "-n", jobs, "-o", "json").stdout)["items"],
            what="the RayJob of job inpod",
        )
        (rayjob,) = rayjobs
        (owner,) = rayjob["metadata"]["ownerReferences"]
        assert owner["kind"] == "LLMTrainingJob" and owner["uid"] == job["metadata"]["uid"], owner
        assert owner["controller"] is True

        # /metrics through the metrics Service, by its DNS name from a pod on the node, once this
        # operator's gauge counted the job it just reconciled. Not through the API server's service
        # proxy: this machine refuses the API server's connections to pod addresses ("resolve_deny").
        cluster.apply(
            [
                _scraper(
                    namespace,
                    f"http://{OPERATOR}-metrics.{namespace}.svc.cluster.local:{METRICS_PORT}/metrics",
                )
            ]
        )
        wait_for(
            lambda: (
                get(cluster, "pod", "scraper", namespace)["status"].get("phase") in ("Succeeded", "Failed")
            ),
            what="the scraper pod to finish",
            timeout=120,
        )
        scraped = cluster.kubectl("logs", "scraper", "-n", namespace).stdout
        assert SUSPENDED_GAUGE in scraped.splitlines(), scraped[-3000:]
    finally:
        took = time.monotonic() - started
        print(f"\noperator pod scenario in {took:.1f} s (+ install {release.install_seconds:.1f} s)")
        cluster.kubectl("delete", "llmtj", "--all", "-n", jobs, "--wait=false", check=False)
        cluster.kubectl("delete", "pod", "scraper", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", jobs, "--wait=false", check=False)
