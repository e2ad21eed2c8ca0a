"""A job whose Ray cluster cannot start says why, with numbers, and fails at its start-up deadline
(`runPolicy.startupDeadlineSeconds`) with no worker pod left (operator/startup.py, diagnosis.py).

What is real here: the API server, the scheduler (its PodScheduled conditions and FailedScheduling
Events, against kwok's 2 x 8-GPU tainted nodes and one CPU node), KubeRay v1.6.1 (the RayCluster,
its pods, its `preRunningDeadlineSeconds`, which would retry the attempt on a second cluster had
the operator not failed the job first, the suspend that deletes the cluster) and the operator's
RBAC. What is not: kwok runs no kubelet, so no image is pulled and no Secret is resolved. For
those two causes a kwok Stage (applied to the test's namespace only) writes what a kubelet writes
for such a pod: phase Pending, Ready False, each container waiting with CreateContainerConfigError
and `secret "<name>" not found`, or ImagePullBackOff and `Back-off pulling image "<image>"`. The
Stage takes the Secret's name and the image from the pod KubeRay made, so they come from the job's
spec through the operator's RayJob and KubeRay, as they would on a real node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from llmtrain.constants import JOB_LABEL

from tests.support.cluster import nodes
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import (
    OperatorProcess,
    Watch,
    apply_doc,
    cpu_job,
    get,
    items,
    job_status,
    wait_for,
    wait_phase,
)
from tests.support.jobs import load_example, with_path

GPU = "nvidia.com/gpu"
DEADLINE = 40  # seconds: long enough to see the waiting message first, short for the test


def _gpu_job(namespace: str, **paths: Any) -> dict[str, Any]:
    doc = load_example("llama3-8b-fsdp.yaml")
    doc["metadata"]["namespace"] = namespace
    for dotted, value in paths.items():
        doc = with_path(doc, dotted, value)
    return doc


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def _blocked(cluster: Cluster, namespace: str, name: str, *words: str) -> dict[str, Any] | None:
    """The job's status once its message and StartupBlocked condition name every word."""
    status = job_status(cluster, namespace, name)
    message = status.get("message") or ""
    blocked = _condition(status, "StartupBlocked")
    named = all(w in message and w in blocked.get("message", "") for w in words)
    if status.get("phase") == "Initializing" and blocked.get("status") == "True" and named:
        return status
    return None


def _ray_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in items(cluster, "pods", namespace, f"{JOB_LABEL}={name}")
        if not p["metadata"].get("deletionTimestamp")
    ]


def _warnings(cluster: Cluster, namespace: str, name: str) -> set[str]:
    events = items(cluster, "events", namespace)
    return {
        e["reason"]
        for e in events
        if e.get("type") == "Warning" and (e.get("involvedObject") or {}).get("name") == name
    }


def _assert_failed_and_stopped(cluster: Cluster, namespace: str, name: str, *words: str) -> None:
    """Failed with StartupDeadlineExceeded naming the cause; no Ray pod left; the RayJob suspended
    and not started again (two resync passes later)."""
    status = wait_phase(cluster, namespace, name, "Failed", timeout=DEADLINE + 60)
    failed = _condition(status, "Failed")
    assert failed.get("reason") == "StartupDeadlineExceeded", status
    assert f"startupDeadlineSeconds ({DEADLINE} s)" in status["message"], status["message"]
    for word in words:
        assert word in status["message"], status["message"]
    wait_for(lambda: not _ray_pods(cluster, namespace, name), timeout=60, what="the job's Ray pods gone")
    rayjob = get(cluster, "rayjob", name, namespace)
    assert rayjob is not None and rayjob["spec"].get("suspend") is True, rayjob
    assert "StartupDeadlineExceeded" in _warnings(cluster, namespace, name)
    time.sleep(21)  # two resync passes and KubeRay's polls: nothing starts again
    assert job_status(cluster, namespace, name)["phase"] == "Failed"
    assert not _ray_pods(cluster, namespace, name)


@pytest.mark.usefixtures("jobs_deleted_first")
def test_more_gpus_than_a_node_has_are_named_then_the_job_fails_at_its_startup_deadline(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=token=x")
    name = "llama3-8b-fsdp"
    doc = _gpu_job(
        namespace,
        **{"spec.resources.gpusPerWorker": 16, "spec.runPolicy.startupDeadlineSeconds": DEADLINE},
    )
    apply_doc(cluster, doc)
    waiting = f"it requests 16 {GPU}, but the most any of the {len(nodes.GPU_NODES)} nodes"
    status = wait_for(
        lambda: _blocked(cluster, namespace, name, waiting, f"can allocate is {nodes.GPUS_PER_NODE}"),
        timeout=DEADLINE - 5,
        what="the waiting message naming the GPUs",
    )
    assert _condition(status, "StartupBlocked")["reason"] == "InsufficientGPU", status
    assert "runPolicy.startupDeadlineSeconds" in status["message"]
    assert "InsufficientGPU" in _warnings(cluster, namespace, name)
    _assert_failed_and_stopped(cluster, namespace, name, f"16 {GPU}")


@pytest.mark.usefixtures("jobs_deleted_first")
def test_the_operator_fails_a_job_at_its_startup_deadline_before_kuberay_retries_it(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """KubeRay retries an attempt that passed its preRunningDeadlineSeconds (on a second Ray
    cluster, while backoffLimit lasts): the operator's own check must fail the job and stop its
    RayJob first, so KubeRay never counts the attempt failed nor creates another cluster."""
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=token=x")
    name = "llama3-8b-fsdp"
    deadline = 12  # seconds: past the operator's first look (10 s), short for the test
    doc = _gpu_job(
        namespace,
        **{"spec.resources.gpusPerWorker": 16, "spec.runPolicy.startupDeadlineSeconds": deadline},
    )
    with (
        Watch(cluster, "rayclusters.ray.io", namespace) as rayclusters,
        Watch(cluster, "rayjobs.ray.io", namespace) as rayjobs,
    ):
        apply_doc(cluster, doc)
        status = wait_phase(cluster, namespace, name, "Failed", timeout=deadline + 40)
        assert _condition(status, "Failed").get("reason") == "StartupDeadlineExceeded", status
        rayjob = wait_for(
            lambda: (
                (r := get(cluster, "rayjob", name, namespace))
                and (r.get("status") or {}).get("jobDeploymentStatus") == "Suspended"
                and r
            ),
            timeout=30,
            what="the RayJob suspended",
        )
    states = [
        ((v.get("status") or {}).get("jobDeploymentStatus"), (v.get("status") or {}).get("reason"))
        for v in rayjobs.versions(name)
    ]
    expired = [s for s in states if s[0] in ("Retrying", "Failed") or s[1] == "PreRunningDeadlineExceeded"]
    failed = rayjob["status"].get("failed") or 0
    clusters = rayclusters.names()
    # None expired by KubeRay's clock, no failed attempt counted, one Ray cluster ever made.
    assert (expired, failed, len(clusters)) == ([], 0, 1), f"{states}; RayClusters {sorted(clusters)}"


@pytest.mark.usefixtures("jobs_deleted_first")
def test_an_accelerator_no_node_has_is_named(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=token=x")
    name = "llama3-8b-fsdp"
    apply_doc(cluster, _gpu_job(namespace, **{"spec.resources.acceleratorType": "NVIDIA-B200"}))
    status = wait_for(
        lambda: _blocked(
            cluster,
            namespace,
            name,
            f"no node has the labels its nodeSelector asks for ({nodes.GPU_PRODUCT_LABEL}=NVIDIA-B200",
            f"{len(nodes.GPU_NODES) + len(nodes.CPU_NODES)} nodes checked",
        ),
        timeout=60,
        what="the waiting message naming the accelerator label",
    )
    assert _condition(status, "StartupBlocked")["reason"] == "NoMatchingNode", status


def _kubelet_stage(namespace: str, reason: str, message: str) -> dict[str, Any]:
    """A kwok Stage writing, for the namespace's pods, what a kubelet writes for a container it
    cannot create. Weighted over kwok's pod-ready (weight 0), which also matches Pending pods."""
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": f"kubelet-{namespace}"[:63]},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                ]
            },
            "weight": 1,
            "next": {
                "statusTemplate": (
                    "conditions:\n"
                    "- {type: PodScheduled, status: 'True'}\n"
                    "- {type: Ready, status: 'False', reason: ContainersNotReady}\n"
                    "- {type: ContainersReady, status: 'False', reason: ContainersNotReady}\n"
                    "containerStatuses:\n"
                    "{{ range .spec.containers }}\n"
                    "- name: {{ .name | Quote }}\n"
                    "  image: {{ .image | Quote }}\n"
                    "  ready: false\n"
                    "  restartCount: 0\n"
                    "  state:\n"
                    "    waiting:\n"
                    f"      reason: {reason}\n"
                    f"      message: {message}\n"
                    "{{ end }}\n"
                    "phase: Pending\n"
                )
            },
        },
    }


# What a kubelet writes (pkg/kubelet/kuberuntime, images) for the missing Secret, which the Stage
# knows as the one HF_TOKEN references (KubeRay's own auth-token Secret exists), or the image; both
# read from the pod KubeRay made.
MISSING_SECRET = (
    '\'secret "{{ range .env }}{{ if eq .name "HF_TOKEN" }}'
    "{{ .valueFrom.secretKeyRef.name }}{{ end }}{{ end }}\" not found'"
)
IMAGE_BACKOFF = "'Back-off pulling image \"{{ .image }}\"'"


@pytest.fixture
def kubelet_says(cluster: Cluster, namespace: str) -> Iterator[Any]:
    names: list[str] = []

    def apply(reason: str, message: str) -> None:
        stage = _kubelet_stage(namespace, reason, message)
        names.append(stage["metadata"]["name"])
        cluster.apply([stage])

    yield apply
    for name in names:
        cluster.kubectl("delete", "stages.kwok.x-k8s.io", name, "--ignore-not-found")


@pytest.mark.usefixtures("jobs_deleted_first")
@pytest.mark.parametrize("cause", ["missing-secret", "image-pull"])
def test_a_missing_secret_or_image_is_named_and_the_job_fails_at_its_deadline(
    cluster: Cluster, operator: OperatorProcess, namespace: str, kubelet_says: Any, cause: str
) -> None:
    name = "boot"
    doc = cpu_job(name, namespace)
    doc["spec"]["runPolicy"]["startupDeadlineSeconds"] = DEADLINE
    if cause == "missing-secret":
        doc["spec"]["model"]["hfTokenSecretRef"] = {"name": "hf-token-missing", "key": "token"}
        kubelet_says("CreateContainerConfigError", MISSING_SECRET)
        words: tuple[str, ...] = ('Secret "hf-token-missing"', "does not exist")
        reason = "MissingSecret"
    else:
        image = "registry.invalid/llmtrain/trainer:does-not-exist"
        doc["spec"]["resources"]["image"] = image
        kubelet_says("ImagePullBackOff", IMAGE_BACKOFF)
        words = (f'image "{image}" cannot be pulled',)
        reason = "ImagePullFailed"
    apply_doc(cluster, doc)
    try:
        status = wait_for(
            lambda: _blocked(cluster, namespace, name, *words),
            timeout=DEADLINE - 5,
            what=f"the {cause} named",
        )
    except AssertionError as exc:
        pods = [(p["metadata"]["name"], p["status"]) for p in _ray_pods(cluster, namespace, name)]
        raise AssertionError(f"{exc}\njob: {job_status(cluster, namespace, name)}\npods: {pods}") from exc
    assert _condition(status, "StartupBlocked")["reason"] == reason, status
    _assert_failed_and_stopped(cluster, namespace, name, *words)
