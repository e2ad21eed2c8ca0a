"""The rendered RayJob meets the real KubeRay operator: it is accepted, KubeRay's RayCluster pods are
placed by the real scheduler under restricted Pod Security, and every state KubeRay moves through
(suspend, deadline, retry, completion) reaches the job's status; deletion is the real garbage
collector's work, and an operator restart neither duplicates nor loses anything.

A job re-created under the same name while the previous job's children are still being deleted
waits for them to go and then runs (it failed for good with ChildConflict before).
"""

from __future__ import annotations

import base64
import datetime
import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from llmtrain.render.rayjob import SUBMITTER_BACKOFF_LIMIT

from tests.support.cluster import nodes
from tests.support.cluster.cluster import REPO_ROOT, Cluster
from tests.support.cluster.steps import (
    HOLD_FINALIZER,
    OperatorProcess,
    Watch,
    apply_doc,
    clear_outcome,
    end_ray_job,
    fail_submitter,
    get,
    items,
    job_status,
    wait_for,
    wait_phase,
)
from tests.support.jobs import load_example, with_path

TINY = "tiny-cpu"
GPU_EXAMPLE = "llama3-8b-fsdp"
GPU = "nvidia.com/gpu"

JOB_POD_LABEL = "batch.kubernetes.io/job-name"
# Why a pod was not created: the Job controller's reason, and KubeRay's for its head and workers.
POD_CREATE_FAILURES = ("FailedCreate", "FailedToCreateHeadPod", "FailedToCreateWorkerPod")


# ---- helpers ------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def example_claim(cluster: Cluster, ns: str) -> None:
    """tiny-cpu reads its data from an existing claim (`storage.claimName`, which `llmtrain upload`
    fills on a real cluster): here kwok provisions and binds it."""
    claim = load_example(f"{TINY}.yaml")["spec"]["storage"]["claimName"]
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": ns},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "shared-rwx",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.apply([pvc])


def _example(file: str, namespace: str, **paths: Any) -> dict[str, Any]:
    """An example with its namespace set and dotted spec paths changed (`resources__workers=2`)."""
    doc = load_example(f"{file}.yaml")
    doc["metadata"]["namespace"] = namespace
    for dotted, value in paths.items():
        doc = with_path(doc, dotted.replace("__", "."), value)
    return doc


def _phases(versions: list[dict[str, Any]]) -> list[str]:
    """The phases an object's status went through, repeats folded."""
    out: list[str] = []
    for version in versions:
        phase = (version.get("status") or {}).get("phase")
        if phase and (not out or out[-1] != phase):
            out.append(phase)
    return out


def _deployment_states(versions: list[dict[str, Any]]) -> list[str]:
    return [str((v.get("status") or {}).get("jobDeploymentStatus") or "") for v in versions]


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def _rayjob(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    rayjob = get(cluster, "rayjob", name, namespace)
    assert rayjob is not None, f"no RayJob {namespace}/{name}"
    return rayjob


def _owner_uids(obj: dict[str, Any]) -> list[str]:
    return [ref["uid"] for ref in obj["metadata"].get("ownerReferences") or []]


def _patch_job(cluster: Cluster, namespace: str, name: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "llmtj", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))


@contextmanager
def _pods_held(cluster: Cluster, namespace: str) -> Iterator[None]:
    """A `pods: 0` ResourceQuota: KubeRay's RayCluster exists but cannot create its pods, so the
    RayJob stays Initializing until the quota goes (a deterministic stand-in for slow nodes)."""
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "hold-pods", "namespace": namespace},
                "spec": {"hard": {"pods": "0"}},
            }
        ]
    )
    try:
        yield
    finally:
        cluster.kubectl("delete", "resourcequota", "hold-pods", "-n", namespace, "--ignore-not-found")


def _set_finalizer(cluster: Cluster, kind: str, namespace: str, name: str, *, held: bool) -> None:
    """Add or remove a test finalizer, so an object outlives its deletion for as long as a test needs."""

    def attempt() -> bool:
        obj = get(cluster, kind, name, namespace)
        if obj is None:
            return not held
        old = list(obj["metadata"].get("finalizers") or [])
        new = [f for f in old if f != HOLD_FINALIZER] + ([HOLD_FINALIZER] if held else [])
        if new == old:
            return True
        ops = [
            {"op": "test", "path": "/metadata/finalizers", "value": old} if old else None,
            {"op": "add" if not old else "replace", "path": "/metadata/finalizers", "value": new},
        ]
        patch = json.dumps([op for op in ops if op])
        result = cluster.kubectl(
            "patch", kind, name, "-n", namespace, "--type=json", "-p", patch, check=False
        )
        return result.returncode == 0

    wait_for(attempt, timeout=20, what=f"{kind}/{name} finalizer {'added' if held else 'removed'}")


def _running_pod(cluster: Cluster, namespace: str, selector: str) -> dict[str, Any]:
    pod: dict[str, Any] = wait_for(
        lambda: next(
            (p for p in items(cluster, "pods", namespace, selector) if p["status"].get("phase") == "Running"),
            None,
        ),
        what=f"a Running pod {selector} in {namespace}",
    )
    return pod


def _exit_submitter(cluster: Cluster, namespace: str, rayjob: str, code: int) -> str:
    """The running submitter pod exits with `code`, once: later attempts' pods are left alone."""
    pod = _running_pod(cluster, namespace, f"{JOB_POD_LABEL}={rayjob}")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    terminated = {"exitCode": code, "reason": "Error" if code else "Completed", "startedAt": now}
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {"terminated": {**terminated, "finishedAt": now}},
        }
        for c in pod["spec"]["containers"]
    ]
    body = {"status": {"phase": "Failed" if code else "Succeeded", "containerStatuses": statuses}}
    name: str = pod["metadata"]["name"]
    cluster.kubectl(
        "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(body)
    )
    return name


def _fail_submitter_job(cluster: Cluster, namespace: str, rayjob: str) -> list[str]:
    """Every attempt of the submitter Job exits 1, until the Job gives up (backoffLimit + 1 pods)."""
    return [_exit_submitter(cluster, namespace, rayjob, 1) for _ in range(SUBMITTER_BACKOFF_LIMIT + 1)]


def _dashboard_tokens(cluster: Cluster) -> dict[str, str]:
    """The Ray auth token each Ray cluster's dashboard requests carried (`<namespace>/<cluster>`)."""
    with urllib.request.urlopen(f"{cluster.dashboard}/control", timeout=10) as response:
        tokens: dict[str, str] = json.load(response)["tokens"]
    return tokens


def _token_secret(pod: dict[str, Any]) -> str:
    """The Secret KubeRay points the pod's RAY_AUTH_TOKEN at (every container)."""
    names = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in pod["spec"]["containers"]
        for e in c.get("env", [])
        if e["name"] == "RAY_AUTH_TOKEN"
    }
    assert len(names) == 1, (pod["metadata"]["name"], names)
    return names.pop()


def _live_gpu_pods(cluster: Cluster) -> list[str]:
    """Pods anywhere in the cluster that hold or wait for GPUs."""
    listed = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in listed
        if p["status"].get("phase") not in ("Succeeded", "Failed")
        and any(GPU in (c.get("resources", {}).get("limits") or {}) for c in p["spec"]["containers"])
    ]


def _delete_jobs(cluster: Cluster, namespace: str) -> None:
    """Foreground: kubectl returns once every child that blocks its owner's deletion is gone."""
    cluster.kubectl(
        "delete", "llmtj", "--all", "-n", namespace, "--cascade=foreground", "--timeout=60s", timeout=90
    )


@pytest.fixture
def ns(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The test's namespace, its jobs deleted with their children before the namespace goes.

    Otherwise KubeRay reacts to the namespace's deletion (its RayCluster goes first), the operator
    posts a phase-change Event into the terminating namespace and the API server refuses it with a
    403 that the `operator` fixture's RBAC check counts as a refusal.
    """
    yield namespace
    _delete_jobs(cluster, namespace)


@pytest.fixture
def gpu_ns(cluster: Cluster, ns: str) -> Iterator[str]:
    """A test's namespace when it takes GPUs: the 16 GPUs are free when it starts and again after it,
    and the Secret the GPU example names exists (a real kubelet would not start the pods without it)."""
    wait_for(lambda: not _live_gpu_pods(cluster), timeout=60, what="every GPU free")
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=hf_x")
    yield ns
    _delete_jobs(cluster, ns)
    wait_for(lambda: not _live_gpu_pods(cluster), timeout=60, what="the test's GPU pods gone")


# ---- 1. the CPU example end to end --------------------------------------------------------------
def test_tiny_cpu_example_runs_on_kuberay_and_succeeds(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    with Watch(cluster, "llmtj", ns) as jobs, Watch(cluster, "rayjobs.ray.io", ns) as rayjobs:
        with _pods_held(cluster, ns):
            cluster.kubectl("apply", "-n", ns, "-f", str(REPO_ROOT / "examples" / f"{TINY}.yaml"))
            held = wait_phase(cluster, ns, TINY, "Initializing")
            assert _rayjob(cluster, ns, TINY)["status"]["jobDeploymentStatus"] == "Initializing"
            assert held["rayClusterName"] and get(cluster, "raycluster", held["rayClusterName"], ns)
        status = wait_phase(cluster, ns, TINY, "Running")
        ray_cluster = status["rayClusterName"]
        assert ray_cluster == _rayjob(cluster, ns, TINY)["status"]["rayClusterName"]
        ray_pods = items(cluster, "pods", ns, f"ray.io/cluster={ray_cluster}")
        roles = sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in ray_pods)
        assert roles == ["head", "worker", "worker"], roles
        for pod in ray_pods:  # placed by the real scheduler; CPU pods do not tolerate the GPU taint
            assert pod["spec"].get("nodeName") in nodes.CPU_NODES, pod["metadata"]["name"]
            assert pod["status"]["phase"] == "Running"
        pvc = get(cluster, "pvc", load_example(f"{TINY}.yaml")["spec"]["storage"]["claimName"], ns)
        assert pvc is not None and pvc["status"]["phase"] == "Bound", pvc
        # Ray's job API is not open: KubeRay made the cluster's token Secret, every Ray pod and the
        # submitter read the token from it, and KubeRay's own dashboard calls carry that token.
        submitter = _running_pod(cluster, ns, f"{JOB_POD_LABEL}={TINY}")
        secrets = {_token_secret(pod) for pod in [*ray_pods, submitter]}
        assert len(secrets) == 1, secrets
        secret = get(cluster, "secret", secrets.pop(), ns)
        assert secret is not None
        assert [o["kind"] for o in secret["metadata"]["ownerReferences"]] == ["RayCluster"]
        token = base64.b64decode(secret["data"]["auth_token"]).decode()
        assert len(token) >= 32
        wait_for(
            lambda: _dashboard_tokens(cluster).get(f"{ns}/{ray_cluster}") == token,
            what="KubeRay's dashboard requests carry the cluster's token",
        )

        end_ray_job(cluster, ns, TINY, succeed=True)
        done = wait_phase(cluster, ns, TINY, "Succeeded", "Failed")
        assert done["phase"] == "Succeeded", done
        assert _rayjob(cluster, ns, TINY)["status"]["jobDeploymentStatus"] == "Complete"
        conditions = _conditions(done)
        assert conditions["Succeeded"]["status"] == "True", conditions
        assert conditions["Running"]["status"] == "False" and conditions["Failed"]["status"] == "False"
        assert done.get("completionTime") and done["message"] == "training finished"
        walk = wait_for(
            lambda: (w := _phases(jobs.versions(TINY)))[-1:] == ["Succeeded"] and w,
            what="the watch caught up",
        )
        states = set(_deployment_states(rayjobs.versions(TINY)))
    assert walk in (
        ["Pending", "Initializing", "Running", "Succeeded"],
        ["Initializing", "Running", "Succeeded"],
    ), walk
    assert not states & {"ValidationFailed", "Failed", "Retrying"}, states


def test_the_pod_template_overlay_reaches_the_pods_kuberay_makes(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    """Private registries, sidecar and identity metadata and an extra volume, under restricted Pod
    Security: what the spec does not model gets to the real pods through the validated overlay."""
    cluster.kubectl("create", "configmap", "vocab", "-n", ns, "--from-literal=words=a b c")
    overlay = {
        "labels": {"team": "nlp"},
        "annotations": {"sidecar.istio.io/inject": "false"},
        "serviceAccountAnnotations": {"iam.gke.io/gcp-service-account": "train@p.iam.gserviceaccount.com"},
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [{"name": "vocab", "configMap": {"name": "vocab"}}],
        "volumeMounts": [{"name": "vocab", "mountPath": "/vocab", "readOnly": True}],
    }
    apply_doc(cluster, _example(TINY, ns, spec__podTemplate=overlay))
    status = wait_phase(cluster, ns, TINY, "Running")
    ray_pods = items(cluster, "pods", ns, f"ray.io/cluster={status['rayClusterName']}")
    submitter = _running_pod(cluster, ns, f"{JOB_POD_LABEL}={TINY}")
    assert len(ray_pods) == 3
    for pod in [*ray_pods, submitter]:
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["labels"]["team"] == "nlp" and meta["labels"]["llmtrain.dev/job"] == TINY
        assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
        assert {"name": "registry"} in spec["imagePullSecrets"], meta["name"]
    for pod in ray_pods:
        assert {"name": "vocab", "configMap": {"name": "vocab", "defaultMode": 420}} in pod["spec"]["volumes"]
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "vocab", "mountPath": "/vocab", "readOnly": True} in mounts
    account = get(cluster, "serviceaccount", f"{TINY}-trainer", ns)
    assert account is not None
    assert account["metadata"]["annotations"] == overlay["serviceAccountAnnotations"]


# ---- 2. GPU placement ---------------------------------------------------------------------------
def test_gpu_example_places_workers_on_gpu_nodes_and_head_on_the_cpu_node(
    cluster: Cluster, operator: OperatorProcess, gpu_ns: str
) -> None:
    ns = gpu_ns
    apply_doc(cluster, _example(GPU_EXAMPLE, ns))
    status = wait_phase(cluster, ns, GPU_EXAMPLE, "Running", "Failed")
    assert status["phase"] == "Running", status
    ray_cluster = status["rayClusterName"]
    workers = items(cluster, "pods", ns, f"ray.io/cluster={ray_cluster},ray.io/node-type=worker")
    assert len(workers) == 1
    for pod in workers:
        spec = pod["spec"]
        assert spec["nodeName"] in nodes.GPU_NODES, spec["nodeName"]
        resources = next(c for c in spec["containers"] if c["name"] == "ray-worker")["resources"]
        assert resources["limits"][GPU] == "8" and resources["requests"][GPU] == "8", resources
        assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"] == {nodes.GPU_PRODUCT_LABEL: nodes.GPU_PRODUCT}
    (head,) = items(cluster, "pods", ns, f"ray.io/cluster={ray_cluster},ray.io/node-type=head")
    assert head["spec"]["nodeName"] in nodes.CPU_NODES
    assert all(GPU not in (c["resources"].get("limits") or {}) for c in head["spec"]["containers"])
    submitter = _running_pod(cluster, ns, f"{JOB_POD_LABEL}={GPU_EXAMPLE}")
    assert submitter["spec"]["nodeName"] in nodes.CPU_NODES
    # Every one of these pods (KubeRay's injected init container included) was admitted by the
    # PodSecurity plugin at the ns's enforced restricted level; none was refused.
    labels = (get(cluster, "namespace", ns) or {})["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    refused = [
        e["message"]
        for e in items(cluster, "events", ns)
        if e.get("reason") in POD_CREATE_FAILURES or "PodSecurity" in e.get("message", "")
    ]
    assert not refused, refused


def test_a_node_selector_for_a_tainted_gpu_pool_takes_the_head_and_submitter_there_too(
    cluster: Cluster, operator: OperatorProcess, gpu_ns: str
) -> None:
    """The head and submitter follow `resources.nodeSelector`; on a pool of tainted GPU nodes they
    must tolerate the taint, or the job never starts (the head stayed Pending before)."""
    ns = gpu_ns
    pool = {"nvidia.com/gpu.present": "true"}  # only the GPU nodes carry it
    apply_doc(cluster, _example(GPU_EXAMPLE, ns, spec__resources__nodeSelector=pool))
    status = wait_phase(cluster, ns, GPU_EXAMPLE, "Running", "Failed")
    assert status["phase"] == "Running", status
    ray_cluster = status["rayClusterName"]
    (head,) = items(cluster, "pods", ns, f"ray.io/cluster={ray_cluster},ray.io/node-type=head")
    submitter = _running_pod(cluster, ns, f"{JOB_POD_LABEL}={GPU_EXAMPLE}")
    for pod in (head, submitter):
        assert pod["spec"]["nodeName"] in nodes.GPU_NODES, pod["metadata"]["name"]
        assert pod["status"]["phase"] == "Running"
        assert all(GPU not in (c["resources"].get("limits") or {}) for c in pod["spec"]["containers"])


def test_two_full_node_gpu_workers_spread_over_both_gpu_nodes(
    cluster: Cluster, operator: OperatorProcess, gpu_ns: str
) -> None:
    ns = gpu_ns
    apply_doc(cluster, _example(GPU_EXAMPLE, ns, spec__resources__workers=2))
    status = wait_phase(cluster, ns, GPU_EXAMPLE, "Running", "Failed")
    assert status["phase"] == "Running", status
    workers = items(cluster, "pods", ns, f"ray.io/cluster={status['rayClusterName']},ray.io/node-type=worker")
    assert sorted(p["spec"]["nodeName"] for p in workers) == sorted(nodes.GPU_NODES)


def test_more_gpus_than_the_cluster_has_leave_a_worker_pending_and_the_job_not_running(
    cluster: Cluster, operator: OperatorProcess, gpu_ns: str
) -> None:
    ns = gpu_ns
    with Watch(cluster, "llmtj", ns) as jobs:
        apply_doc(cluster, _example(GPU_EXAMPLE, ns, spec__resources__workers=3))  # 24 GPUs of 16

        def unschedulable() -> str | None:
            for pod in items(cluster, "pods", ns, "ray.io/node-type=worker"):
                for cond in pod["status"].get("conditions") or []:
                    if cond["type"] == "PodScheduled" and cond["status"] == "False":
                        message: str = cond.get("message", "")
                        if f"Insufficient {GPU}" in message:
                            return message
            return None

        wait_for(unschedulable, what=f"a worker pod Pending for Insufficient {GPU}")
        status = wait_phase(cluster, ns, GPU_EXAMPLE, "Initializing")
        time.sleep(6)  # two of KubeRay's polls: it must keep waiting for the missing worker
        placed = [
            p for p in items(cluster, "pods", ns, "ray.io/node-type=worker") if p["spec"].get("nodeName")
        ]
        assert len(placed) == 2, [p["metadata"]["name"] for p in placed]
        assert _rayjob(cluster, ns, GPU_EXAMPLE)["status"]["jobDeploymentStatus"] == "Initializing"
        assert not items(cluster, "jobs", ns), "KubeRay submitted to an incomplete Ray cluster"
        assert job_status(cluster, ns, GPU_EXAMPLE)["phase"] == "Initializing", status
        assert "Running" not in _phases(jobs.versions(GPU_EXAMPLE))


# ---- 3. suspend and resume ----------------------------------------------------------------------
def test_suspend_deletes_the_ray_cluster_and_resume_starts_a_new_one(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    apply_doc(cluster, _example(TINY, ns))
    first = wait_phase(cluster, ns, TINY, "Running")["rayClusterName"]

    _patch_job(cluster, ns, TINY, {"runPolicy": {"suspend": True}})
    wait_for(lambda: _rayjob(cluster, ns, TINY)["spec"].get("suspend") is True, what="RayJob suspended")
    wait_for(lambda: get(cluster, "raycluster", first, ns) is None, what=f"RayCluster {first} deleted")
    wait_for(lambda: not items(cluster, "pods", ns, f"ray.io/cluster={first}"), what="Ray pods gone")
    suspended = wait_phase(cluster, ns, TINY, "Suspended")
    conditions = _conditions(suspended)
    assert conditions["Suspended"]["status"] == "True" and conditions["Running"]["status"] == "False"
    wait_for(
        lambda: _rayjob(cluster, ns, TINY)["status"].get("jobDeploymentStatus") == "Suspended",
        what="RayJob Suspended",
    )
    # The deleted cluster is not named any more.
    wait_for(
        lambda: "rayClusterName" not in (s := job_status(cluster, ns, TINY)) and "dashboardURL" not in s,
        what="status no longer naming the deleted Ray cluster",
    )

    _patch_job(cluster, ns, TINY, {"runPolicy": {"suspend": False}})
    resumed = wait_phase(cluster, ns, TINY, "Running")
    second = resumed["rayClusterName"]
    assert second != first
    assert get(cluster, "raycluster", second, ns) is not None
    assert _rayjob(cluster, ns, TINY)["spec"].get("suspend") is False
    assert _conditions(resumed)["Suspended"]["status"] == "False"


# ---- 4. deadline --------------------------------------------------------------------------------
def test_active_deadline_fails_the_job_with_kuberays_reason_and_no_retry(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    deadline = 8
    with Watch(cluster, "rayjobs.ray.io", ns) as rayjobs:
        apply_doc(cluster, _example(TINY, ns, spec__runPolicy__activeDeadlineSeconds=deadline))
        wait_phase(cluster, ns, TINY, "Running")
        status = wait_phase(cluster, ns, TINY, "Failed", "Succeeded", timeout=deadline + 40)
        versions = rayjobs.versions(TINY)
    assert status["phase"] == "Failed", status
    failed = _conditions(status)["Failed"]
    assert failed["status"] == "True" and failed["reason"] == "DeadlineExceeded", failed
    assert "activeDeadlineSeconds" in status["message"], status["message"]
    assert _rayjob(cluster, ns, TINY)["status"]["reason"] == "DeadlineExceeded"
    started, ended = (
        datetime.datetime.fromisoformat(status[k].replace("Z", "+00:00"))
        for k in ("startTime", "completionTime")
    )
    assert (ended - started).total_seconds() >= deadline, (started, ended)
    # A deadline is final: maxRetries (1 in the example) does not start another cluster.
    assert "Retrying" not in _deployment_states(versions)
    assert len({(v.get("status") or {}).get("rayClusterName") for v in versions} - {None}) == 1
    assert status["retries"] == 0, status


# ---- 5. submitter failure, retry, exhaustion ----------------------------------------------------
def test_submitter_failure_retries_on_a_new_cluster_then_fails_when_retries_run_out(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    try:
        with (
            Watch(cluster, "llmtj", ns) as jobs,
            Watch(cluster, "rayjobs.ray.io", ns) as rayjobs,
        ):
            apply_doc(cluster, _example(TINY, ns))  # runPolicy.maxRetries: 1
            first = wait_phase(cluster, ns, TINY, "Running")["rayClusterName"]
            _fail_submitter_job(cluster, ns, TINY)
            retried = wait_for(
                lambda: (
                    (s := job_status(cluster, ns, TINY)).get("phase") == "Running"
                    and s.get("rayClusterName") not in (None, first)
                    and s
                ),
                what="Running again on a new Ray cluster",
            )
            assert retried["retries"] == 1, retried
            assert _rayjob(cluster, ns, TINY)["status"]["failed"] == 1
            walk = wait_for(
                lambda: (
                    (w := _phases(jobs.versions(TINY))).count("Running") == 2 and w[-1] == "Running" and w
                ),
                what="the watch caught up",
            )
            between = walk[walk.index("Running") + 1 : -1]
            assert between and set(between) <= {"Initializing", "Pending"}, walk
            assert "Retrying" in _deployment_states(rayjobs.versions(TINY))

            fail_submitter(cluster, ns)
            status = wait_phase(cluster, ns, TINY, "Failed")
            versions = rayjobs.versions(TINY)
        failed = _conditions(status)["Failed"]
        assert failed["status"] == "True" and failed["reason"] == "SubmissionFailed", failed
        assert status["message"].startswith("the job could not be submitted"), status["message"]
        assert _rayjob(cluster, ns, TINY)["status"]["reason"] == "SubmissionFailed"
        clusters = {(v.get("status") or {}).get("rayClusterName") for v in versions} - {None}
        assert len(clusters) == 2, clusters  # the first attempt and its one retry, no third
        assert status["retries"] == 1, status  # one retry ran; KubeRay's status.failed is 2
    finally:
        clear_outcome(cluster, ns)


def test_a_submitter_pod_that_exits_is_run_again_and_reattaches_without_using_a_retry(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    """A dropped log stream, a drained node or a preempted submitter costs a pod, not a whole-run
    retry on a fresh cluster: the next submitter attaches to the Ray job that is still running."""
    try:
        apply_doc(cluster, _example(TINY, ns))
        first = wait_phase(cluster, ns, TINY, "Running")["rayClusterName"]
        gone = _exit_submitter(cluster, ns, TINY, 1)
        again = _running_pod(cluster, ns, f"{JOB_POD_LABEL}={TINY}")
        assert again["metadata"]["name"] != gone
        status = job_status(cluster, ns, TINY)
        assert (status["phase"], status["rayClusterName"], status["retries"]) == ("Running", first, 0), status
        rayjob = _rayjob(cluster, ns, TINY)["status"]
        assert rayjob["jobDeploymentStatus"] == "Running" and not rayjob.get("failed"), rayjob
        end_ray_job(cluster, ns, TINY, succeed=True)
        done = wait_phase(cluster, ns, TINY, "Succeeded", "Failed")
        assert (done["phase"], done["rayClusterName"], done["retries"]) == ("Succeeded", first, 0), done
    finally:
        clear_outcome(cluster, ns)


# ---- 6. deletion --------------------------------------------------------------------------------
def test_deleting_the_job_garbage_collects_every_child(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    # A claim the job creates with `reclaim: Delete` goes with it (Retain, the default, and the
    # example's own named claim would not: test_reconcile's retained-claim test).
    created = {"create": {"size": "1Gi", "storageClassName": "shared-rwx", "reclaim": "Delete"}}
    apply_doc(cluster, _example(TINY, ns, spec__storage=created))
    status = wait_phase(cluster, ns, TINY, "Running")
    job = get(cluster, "llmtj", TINY, ns)
    assert job is not None
    _running_pod(cluster, ns, f"{JOB_POD_LABEL}={TINY}")
    trainer = f"{TINY}-trainer"
    children = [
        ("rayjob", TINY),
        ("raycluster", status["rayClusterName"]),
        ("job", TINY),
        ("configmap", f"{TINY}-config"),
        ("pvc", f"{TINY}-storage"),
        ("serviceaccount", trainer),
        *(("pod", p["metadata"]["name"]) for p in items(cluster, "pods", ns)),
    ]
    uids = {}
    for kind, name in children:
        obj = get(cluster, kind, name, ns)
        assert obj is not None, f"{kind}/{name} missing before the delete"
        uids[(kind, name)] = obj["metadata"]["uid"]
    assert len([k for k, _ in children if k == "pod"]) == 4  # head, 2 workers, submitter
    for kind, name in children[:1] + children[3:6]:  # the operator's own children
        owned = get(cluster, kind, name, ns)
        assert owned is not None and _owner_uids(owned) == [job["metadata"]["uid"]], f"{kind}/{name}"

    cluster.kubectl("delete", "llmtj", TINY, "-n", ns)

    def left() -> list[str]:
        return [
            f"{kind}/{name}"
            for (kind, name), uid in uids.items()
            if (obj := get(cluster, kind, name, ns)) is not None and obj["metadata"]["uid"] == uid
        ]

    wait_for(lambda: not left(), timeout=60, what="every child garbage-collected")


# ---- 7. delete and re-create under the same name ------------------------------------------------
def test_recreating_a_deleted_job_under_the_same_name_gets_fresh_children(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    doc = _example(TINY, ns)
    apply_doc(cluster, doc)
    wait_phase(cluster, ns, TINY, "Running")
    uid1 = (get(cluster, "llmtj", TINY, ns) or {})["metadata"]["uid"]
    rayjob1 = _rayjob(cluster, ns, TINY)["metadata"]["uid"]

    # Foreground: the job stays (deletionTimestamp set) until its children are gone, since the
    # operator sets blockOwnerDeletion; an apply meanwhile lands on the dying object, creates nothing.
    _set_finalizer(cluster, "rayjob", ns, TINY, held=True)
    try:
        cluster.kubectl("delete", "llmtj", TINY, "-n", ns, "--cascade=foreground", "--wait=false")
        wait_for(
            lambda: _rayjob(cluster, ns, TINY)["metadata"].get("deletionTimestamp"),
            what="the RayJob being deleted",
        )
        again = apply_doc(cluster, doc)
        dying = get(cluster, "llmtj", TINY, ns)
        assert dying is not None and dying["metadata"]["uid"] == uid1, again.stdout
        assert dying["metadata"].get("deletionTimestamp"), dying["metadata"]
    finally:
        _set_finalizer(cluster, "rayjob", ns, TINY, held=False)
    wait_for(lambda: get(cluster, "llmtj", TINY, ns) is None, what="the job gone after its children")
    assert get(cluster, "rayjob", TINY, ns) is None

    apply_doc(cluster, doc)
    wait_phase(cluster, ns, TINY, "Running")
    uid2 = (get(cluster, "llmtj", TINY, ns) or {})["metadata"]["uid"]
    rayjob2 = _rayjob(cluster, ns, TINY)
    assert uid2 != uid1 and rayjob2["metadata"]["uid"] != rayjob1
    assert _owner_uids(rayjob2) == [uid2]

    # Background, re-created at once while the old RayJob is still finalizing: the new job must
    # never take over the old job's children (it adopts only objects without a controller); it
    # waits for them to go, then runs on children of its own.
    _set_finalizer(cluster, "rayjob", ns, TINY, held=True)
    try:
        cluster.kubectl("delete", "llmtj", TINY, "-n", ns, "--wait=true")
        apply_doc(cluster, doc)
        uid3 = (get(cluster, "llmtj", TINY, ns) or {})["metadata"]["uid"]
        assert uid3 not in (uid1, uid2)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            old = _rayjob(cluster, ns, TINY)
            assert old["metadata"]["uid"] == rayjob2["metadata"]["uid"]
            assert _owner_uids(old) == [uid2], old["metadata"]["ownerReferences"]
            assert job_status(cluster, ns, TINY).get("phase") != "Failed"
            time.sleep(0.5)
    finally:
        _set_finalizer(cluster, "rayjob", ns, TINY, held=False)
    wait_phase(cluster, ns, TINY, "Running", timeout=90)
    rayjob3 = _rayjob(cluster, ns, TINY)
    assert rayjob3["metadata"]["uid"] != rayjob2["metadata"]["uid"]
    assert _owner_uids(rayjob3) == [uid3]


# ---- 8. operator restart ------------------------------------------------------------------------
def test_operator_killed_mid_run_converges_without_duplicates_and_picks_up_new_jobs(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    second = f"{TINY}-b"
    with _pods_held(cluster, ns):
        apply_doc(cluster, _example(TINY, ns))
        ray_cluster = wait_phase(cluster, ns, TINY, "Initializing")["rayClusterName"]
        operator.stop(kill=True)
    try:
        # KubeRay carries on alone: the quota is gone, the first job's cluster starts and runs.
        wait_for(
            lambda: _rayjob(cluster, ns, TINY)["status"].get("jobDeploymentStatus") == "Running",
            what="the RayJob Running while the operator is down",
        )
        assert job_status(cluster, ns, TINY)["phase"] == "Initializing"
        apply_doc(cluster, with_path(_example(TINY, ns), "metadata.name", second))
        time.sleep(1)
        assert get(cluster, "rayjob", second, ns) is None
    finally:
        operator.restart()
    first_status = wait_phase(cluster, ns, TINY, "Running")
    assert first_status["rayClusterName"] == ray_cluster
    wait_phase(cluster, ns, second, "Running")

    rayjobs = items(cluster, "rayjobs", ns)
    assert sorted(r["metadata"]["name"] for r in rayjobs) == [TINY, second]
    for rayjob in rayjobs:
        owner = get(cluster, "llmtj", rayjob["metadata"]["name"], ns)
        assert owner is not None and _owner_uids(rayjob) == [owner["metadata"]["uid"]]
    clusters = items(cluster, "rayclusters", ns)
    owners = sorted(ref["name"] for c in clusters for ref in c["metadata"]["ownerReferences"])
    assert owners == [TINY, second], owners
    assert ray_cluster in {c["metadata"]["name"] for c in clusters}
    for name in (TINY, second):
        pods = items(cluster, "pods", ns, f"llmtrain.dev/job={name},llmtrain.dev/role!=submitter")
        assert len(pods) == 3, [p["metadata"]["name"] for p in pods]  # one head, two workers
