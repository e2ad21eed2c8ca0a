"""The infiniband and efa profiles against the real API server's Pod Security admission and the real
KubeRay. By default their workers add no capability and restricted admits them; with
`network.fabric.ipcLock` they add IPC_LOCK, which neither the restricted nor the baseline level
admits, so such a job's workers are refused in the restricted namespaces every other job runs in, with
PodSecurity's message naming the capability, and run in a namespace enforcing privileged, placed on
the GPU nodes that advertise the fabric device (kwok nodes, tests/support/cluster/nodes.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.render import render

from tests.support.cluster import nodes
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import OperatorProcess, apply_doc, cpu_job, items, wait_for, wait_phase

DEVICE = "rdma/rdma_shared_device_a"
ENFORCE = "pod-security.kubernetes.io/enforce"


def fabric_job(name: str, namespace: str, *, ipc_lock: bool = True) -> dict[str, Any]:
    doc = cpu_job(name, namespace)
    doc["spec"]["resources"].update(gpusPerWorker=8, cpu="4")  # half a core per GPU process
    doc["spec"]["network"] = {"ncclProfile": "infiniband"}
    if ipc_lock:
        doc["spec"]["network"]["fabric"] = {"ipcLock": True}
    return doc


def _gpu_pods(cluster: Cluster) -> list[str]:
    listed = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    return [
        p["metadata"]["name"]
        for p in listed
        if p["status"].get("phase") not in ("Succeeded", "Failed")
        and any(
            "nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {}) for c in p["spec"]["containers"]
        )
    ]


@pytest.fixture
def fabric_ns(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The test's (restricted) namespace with the 16 GPUs free; its jobs deleted first at the end."""
    wait_for(lambda: not _gpu_pods(cluster), timeout=60, what="every GPU free")
    yield namespace
    cluster.kubectl(
        "delete", "llmtj", "--all", "-n", namespace, "--cascade=foreground", "--timeout=60s", timeout=90
    )
    wait_for(lambda: not _gpu_pods(cluster), timeout=60, what="the test's GPU pods gone")


def _set_level(cluster: Cluster, namespace: str, level: str) -> None:
    cluster.kubectl(
        "label",
        "namespace",
        namespace,
        f"{ENFORCE}={level}",
        f"pod-security.kubernetes.io/warn={level}",
        "--overwrite",
    )


def _worker_pod(name: str, namespace: str, *, ipc_lock: bool = True) -> dict[str, Any]:
    """A Pod of the fabric job's worker template, as KubeRay would create it."""
    doc = fabric_job(name, namespace, ipc_lock=ipc_lock)
    (rayjob,) = [o for o in render(parse_job(doc)) if o["kind"] == "RayJob"]
    spec = dict(rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"])
    spec["serviceAccountName"] = "default"  # no trainer account exists for a dry run
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-worker"}, "spec": spec}


def test_pod_security_admits_a_fabric_worker_only_at_privileged(cluster: Cluster, namespace: str) -> None:
    """Server-side dry runs of the worker pod: restricted and baseline refuse IPC_LOCK (baseline's
    capability list does not hold it), privileged admits it."""
    pod = json.dumps(_worker_pod("fabric", namespace))
    refused = {}
    for level in ("restricted", "baseline", "privileged"):
        _set_level(cluster, namespace, level)
        result = cluster.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", "-", input=pod, check=False
        )
        refused[level] = result.stderr if result.returncode else ""
    for level in ("restricted", "baseline"):
        assert f'violates PodSecurity "{level}:latest"' in refused[level], refused[level]
        assert '"IPC_LOCK"' in refused[level] and "securityContext.capabilities.add" in refused[level]
    assert refused["privileged"] == ""


def test_by_default_a_fabric_worker_adds_no_capability_and_is_admitted_at_restricted(
    cluster: Cluster, namespace: str
) -> None:
    """`ipcLock` is off unless asked for: the default fabric worker keeps the namespace restricted."""
    pod = _worker_pod("fabric", namespace, ipc_lock=False)
    container = pod["spec"]["containers"][0]
    assert "add" not in container["securityContext"]["capabilities"]
    assert container["resources"]["limits"][DEVICE] == "1"
    _set_level(cluster, namespace, "restricted")
    result = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False
    )
    assert result.returncode == 0 and "PodSecurity" not in result.stderr, result.stderr


def test_a_fabric_job_is_refused_by_restricted_pod_security_with_a_clear_message(
    cluster: Cluster, operator: OperatorProcess, fabric_ns: str
) -> None:
    ns = fabric_ns
    apply_doc(cluster, fabric_job("fabric", ns))

    def refusal() -> str | None:
        for event in items(cluster, "events", ns):
            message: str = event.get("message", "")
            if "PodSecurity" in message and "IPC_LOCK" in message:
                return message
        return None

    message = wait_for(refusal, timeout=90, what="PodSecurity refusing the fabric worker")
    assert 'violates PodSecurity "restricted:latest"' in message, message
    assert not items(cluster, "pods", ns, "ray.io/node-type=worker")
    # The head, restricted, was admitted.
    wait_for(lambda: items(cluster, "pods", ns, "ray.io/node-type=head"), what="the head pod")


def test_a_fabric_job_runs_in_a_privileged_namespace_on_a_node_with_the_device(
    cluster: Cluster, operator: OperatorProcess, fabric_ns: str
) -> None:
    ns = fabric_ns
    _set_level(cluster, ns, "privileged")
    apply_doc(cluster, fabric_job("fabric", ns))
    status = wait_phase(cluster, ns, "fabric", "Running", "Failed", timeout=120)
    assert status["phase"] == "Running", status
    (worker,) = items(
        cluster, "pods", ns, f"ray.io/cluster={status['rayClusterName']},ray.io/node-type=worker"
    )
    assert worker["spec"]["nodeName"] in nodes.GPU_NODES
    container = next(c for c in worker["spec"]["containers"] if c["name"] == "ray-worker")
    assert container["resources"]["limits"][DEVICE] == "1"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    (head,) = items(cluster, "pods", ns, f"ray.io/cluster={status['rayClusterName']},ray.io/node-type=head")
    assert all("add" not in c["securityContext"]["capabilities"] for c in head["spec"]["containers"])
    assert not [e for e in items(cluster, "events", ns) if "PodSecurity" in e.get("message", "")]
