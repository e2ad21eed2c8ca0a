"""Kueue gates a queued job for real: its webhook creates the RayJob suspended, its scheduler admits
it when a ClusterQueue has quota for every pod (head, GPU workers, KubeRay's submitter), and it
suspends it again to preempt it. After each of Kueue's actions the operator must leave the RayJob's
`spec.suspend` alone: a watch records every stored version of the RayJobs, so a flip and flip-back
between two polls still fails the test. Before the operator left a queued RayJob's `suspend` to
Kueue, any reconcile of a job Kueue had not admitted (a label change, an operator restart, Kopf
rerunning the create handler after a 409) wrote `false` over Kueue's `true`, and KubeRay started GPU
workers outside the quota until Kueue suspended the job again.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llmtrain.constants import FINISHED_LABEL

from tests.support.cluster import nodes
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.kueue import API, kueue_configured, kueue_queue_objects
from tests.support.cluster.steps import (
    OperatorProcess,
    Watch,
    apply_doc,
    get,
    items,
    job_status,
    wait_for,
    wait_phase,
)
from tests.support.jobs import load_example

LOCAL_QUEUE = "gpu-queue"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MAX_EXEC_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
# Held long enough for Kueue's and the operator's controllers to act on the state being checked.
HOLD_SECONDS = 6


class Queue:
    """A ResourceFlavor, ClusterQueue and LocalQueue of one test, named after its namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.cluster_queue = f"cq-{namespace}"
        self.flavor = f"flavor-{namespace}"
        self.priority_classes: list[str] = []

    def apply(self, *, gpus: int, preemption: dict[str, str] | None = None) -> None:
        """Create or resize the quota; CPU and memory cover head, workers and submitter of two jobs,
        so GPUs are what a job waits for."""
        objs = kueue_queue_objects(
            cluster_queue=self.cluster_queue,
            local_queue=LOCAL_QUEUE,
            namespace=self.namespace,
            flavor=self.flavor,
            gpus=gpus,
            cpus="250",
            memory="2500Gi",
        )
        if preemption:
            objs[1]["spec"]["preemption"] = preemption
        self.cluster.apply(objs)

    def priority_class(self, value: int) -> str:
        name = f"{self.namespace}-{value}"
        self.cluster.apply(
            [
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                    "description": "a test's training priority",
                }
            ]
        )
        self.priority_classes.append(name)
        return name


@pytest.fixture
def queue(cluster: Cluster, operator: OperatorProcess, namespace: str) -> Iterator[Queue]:
    """The example's Secret and a queue; on teardown the jobs go first, so their GPUs are free again
    for the next test (two GPU nodes serve the whole session)."""
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "hf-token", "namespace": namespace},
                "stringData": {"token": "hf_test_token"},
            }
        ]
    )
    q = Queue(cluster, namespace)
    yield q
    cluster.kubectl("delete", "llmtj", "--all", "-n", namespace, "--wait=false")
    wait_for(lambda: not items(cluster, "pods", namespace), timeout=90, what=f"the pods of {namespace} gone")
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=false", f"localqueue/{LOCAL_QUEUE}", "-n", namespace
    )
    cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "--wait=false",
        f"clusterqueue/{q.cluster_queue}",
        f"resourceflavor/{q.flavor}",
        *(f"priorityclass/{p}" for p in q.priority_classes),
    )


def gpu_job(name: str, namespace: str, *, priority_class: str | None = None) -> dict[str, Any]:
    """examples/llama3-8b-fsdp.yaml (one worker of 8 GPUs) sent to the test's LocalQueue."""
    doc = copy.deepcopy(load_example("llama3-8b-fsdp.yaml"))
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["runPolicy"]["queueName"] = LOCAL_QUEUE
    if priority_class:
        doc["spec"]["resources"]["priorityClassName"] = priority_class
    return doc


def rayjob(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    obj = get(cluster, "rayjob", name, namespace)
    assert obj is not None, f"RayJob {namespace}/{name} not found"
    return obj


def workload(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """Kueue's Workload for the RayJob `name` (named after the job plus a hash, labelled with its uid)."""
    uid = rayjob(cluster, namespace, name)["metadata"]["uid"]
    found = items(cluster, "workloads.kueue.x-k8s.io", namespace, f"kueue.x-k8s.io/job-uid={uid}")
    return found[0] if found else None


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for cond in (obj or {}).get("status", {}).get("conditions") or []:
        if cond["type"] == ctype:
            return dict(cond)
    return {}


def ray_clusters(cluster: Cluster, namespace: str, job: str) -> list[dict[str, Any]]:
    return [
        c
        for c in items(cluster, "rayclusters", namespace)
        if any(ref.get("name") == job for ref in c["metadata"].get("ownerReferences") or [])
    ]


def handled_labels(
    cluster: Cluster, namespace: str, name: str, field: str = "labels"
) -> dict[str, str] | None:
    """The job's labels (or annotations) as Kopf recorded them after its handlers succeeded; None
    before that."""
    last = job_status(cluster, namespace, name).get("kopf", {}).get("lastHandled")
    if not last:
        return None
    labels: dict[str, str] = json.loads(last).get("metadata", {}).get(field, {})
    return labels


def wait_admitted_on_gpus(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """Kueue admitted the job and lifted the suspension; the Ray cluster KubeRay made for it has its
    workers running on GPU nodes; the job's phase is Running."""
    wait_for(
        lambda: condition(workload(cluster, namespace, name), "Admitted").get("status") == "True",
        what=f"Kueue admitting {name}",
    )
    wait_for(
        lambda: rayjob(cluster, namespace, name)["spec"].get("suspend") is not True,
        what=f"Kueue lifting the suspension of {name}",
    )

    def running_workers() -> list[dict[str, Any]]:
        current = (rayjob(cluster, namespace, name).get("status") or {}).get("rayClusterName")
        if not current:
            return []
        pods = items(cluster, "pods", namespace, f"ray.io/cluster={current},llmtrain.dev/role=worker")
        return pods if pods and all(p["status"].get("phase") == "Running" for p in pods) else []

    workers = wait_for(running_workers, timeout=90, what=f"the workers of {name} running")
    assert {p["spec"]["nodeName"] for p in workers} <= set(nodes.GPU_NODES), workers
    return wait_phase(cluster, namespace, name, "Running")


def assert_queued(cluster: Cluster, namespace: str, name: str) -> bool:
    """Suspended by Kueue and nothing of it running: no Ray cluster, no pod, no GPU used."""
    assert rayjob(cluster, namespace, name)["spec"].get("suspend") is True
    assert not ray_clusters(cluster, namespace, name)
    assert not items(cluster, "pods", namespace, f"llmtrain.dev/job={name}")
    assert condition(workload(cluster, namespace, name), "Admitted").get("status") != "True"
    status = job_status(cluster, namespace, name)
    # Queued, not "Suspended": nothing the user did suspended it, and the message names the queue.
    assert status.get("phase") == "Pending", status
    assert f"queued in Kueue LocalQueue {LOCAL_QUEUE!r}" in status.get("message", ""), status
    assert condition({"status": status}, "Running").get("status") == "False", status
    return True


def wait_queued(cluster: Cluster, namespace: str, name: str) -> None:
    """Until the operator has handled the job and the job sits queued, with any Ray cluster started
    meanwhile gone again (see the module docstring)."""
    wait_for(
        lambda: handled_labels(cluster, namespace, name) is not None, what=f"the operator handling {name}"
    )
    wait_for(lambda: assert_queued(cluster, namespace, name), what=f"{name} queued and settled")


def hold(check: Callable[[], object], seconds: float = HOLD_SECONDS) -> None:
    """`check` passes on every poll for `seconds`: a state that must last, not just be reached."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check()
        time.sleep(0.5)


def mark(cluster: Cluster, watch: Watch, namespace: str, name: str) -> int:
    """The index of the RayJob's current version in the watch, once the watch has caught up with it."""

    def caught_up() -> int | None:
        current = rayjob(cluster, namespace, name)["metadata"]["resourceVersion"]
        seen = watch.versions(name)
        return len(seen) if seen and seen[-1]["metadata"]["resourceVersion"] == current else None

    index: int = wait_for(caught_up, what=f"the watch caught up with RayJob {name}") - 1
    return index


def suspend_history(watch: Watch, name: str, since: int) -> list[bool]:
    """spec.suspend of every RayJob version stored from the marked one on, repeats collapsed.

    Generations are checked contiguous from creation: every spec the API server stored was seen,
    so no flip can hide between two of them.
    """
    versions = watch.versions(name)
    generations = sorted({v["metadata"]["generation"] for v in versions})
    assert generations == list(range(1, generations[-1] + 1)), generations
    history: list[bool] = []
    for v in versions[since:]:
        value = v["spec"].get("suspend") is True
        if not history or history[-1] != value:
            history.append(value)
    return history


def writers(watch: Watch, name: str, since: int) -> list[tuple[int, bool, list[str]]]:
    """For a failure message: each version's generation, suspend and spec writers (managedFields)."""
    return [
        (
            v["metadata"]["generation"],
            v["spec"].get("suspend") is True,
            sorted(
                f"{m['manager']}@{m['time']}"
                for m in v["metadata"].get("managedFields") or []
                if m.get("subresource") != "status"
            ),
        )
        for v in watch.versions(name)[since:]
    ]


def test_queued_job_waits_suspended_until_a_cluster_queue_has_gpu_quota(
    cluster: Cluster, queue: Queue, namespace: str
) -> None:
    queue.apply(gpus=4)  # the worker needs 8
    with Watch(cluster, "rayjobs", namespace) as watch:
        apply_doc(cluster, gpu_job("llama", namespace))
        wait_for(lambda: workload(cluster, namespace, "llama"), what="Kueue's Workload for the RayJob")
        created = wait_for(lambda: watch.versions("llama"), what="the RayJob in the watch")[0]
        assert created["spec"]["suspend"] is True  # as stored at creation: Kueue's webhook set it
        assert rayjob(cluster, namespace, "llama")["metadata"]["labels"][QUEUE_LABEL] == LOCAL_QUEUE
        # What Kueue's RayJob integration counts against the quota: every pod, the submitter too.
        wl = workload(cluster, namespace, "llama")
        assert wl is not None
        podsets = {p["name"]: p for p in wl["spec"]["podSets"]}
        assert set(podsets) == {"head", "workers", "submitter"}, podsets
        worker = podsets["workers"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert podsets["workers"]["count"] == 1 and worker["nvidia.com/gpu"] == "8", podsets["workers"]
        pending = wait_for(
            lambda: (
                (c := condition(workload(cluster, namespace, "llama"), "QuotaReserved")).get("status")
                == "False"
                and "nvidia.com/gpu" in c.get("message", "")
                and c
            ),
            what="Kueue reporting the GPU quota short",
        )
        assert pending["reason"] == "Pending", pending

        wait_queued(cluster, namespace, "llama")
        since = mark(cluster, watch, namespace, "llama")
        hold(lambda: assert_queued(cluster, namespace, "llama"))

        queue.apply(gpus=8)
        status = wait_admitted_on_gpus(cluster, namespace, "llama")
        assert status["rayClusterName"] == rayjob(cluster, namespace, "llama")["status"]["rayClusterName"]
        assert suspend_history(watch, "llama", since) == [True, False], writers(watch, "llama", since)


def test_queued_job_is_admitted_when_the_job_holding_the_quota_goes(
    cluster: Cluster, queue: Queue, namespace: str, operator: OperatorProcess
) -> None:
    queue.apply(gpus=8)  # room for one 8-GPU worker
    with Watch(cluster, "rayjobs", namespace) as watch:
        apply_doc(cluster, gpu_job("first", namespace))
        wait_admitted_on_gpus(cluster, namespace, "first")
        first_since = mark(cluster, watch, namespace, "first")
        apply_doc(cluster, gpu_job("second", namespace))
        wait_queued(cluster, namespace, "second")
        since = mark(cluster, watch, namespace, "second")

        def second_waits() -> None:
            assert_queued(cluster, namespace, "second")
            assert job_status(cluster, namespace, "first").get("phase") == "Running"

        hold(second_waits)
        # Reconciles of the queued job (a label, an annotation, its TTL and deadline edited, the
        # operator killed and restarted) leave it queued: the operator never writes suspend of a
        # queued RayJob.
        cluster.kubectl("label", "llmtj", "second", "-n", namespace, "waiting=yes")
        wait_for(
            lambda: (handled_labels(cluster, namespace, "second") or {}).get("waiting") == "yes",
            what="the operator handling the label change of the queued job",
        )
        cluster.kubectl("annotate", "llmtj", "second", "-n", namespace, "note=queued")
        wait_for(
            lambda: (
                (handled_labels(cluster, namespace, "second", "annotations") or {}).get("note") == "queued"
            ),
            what="the operator handling the annotation of the queued job",
        )
        # TTL and deadline edits reach the queued RayJob's spec (the operator writes it), suspend not.
        for field, value in (("ttlSecondsAfterFinished", 120), ("activeDeadlineSeconds", 7200)):
            patch = json.dumps({"spec": {"runPolicy": {field: value}}})
            cluster.kubectl("patch", "llmtj", "second", "-n", namespace, "--type=merge", "-p", patch)
            wait_for(
                lambda field=field, value=value: (
                    rayjob(cluster, namespace, "second")["spec"].get(field) == value
                ),
                what=f"the queued RayJob's {field} edited",
            )
        hold(second_waits)
        operator.restart(kill=True)
        hold(second_waits)
        assert not ray_clusters(cluster, namespace, "second")
        # From its very first stored version, creation included: suspended, never flipped.
        assert suspend_history(watch, "second", 0) == [True], writers(watch, "second", 0)
        assert suspend_history(watch, "first", first_since) == [False], writers(watch, "first", first_since)

        cluster.kubectl("delete", "llmtj", "first", "-n", namespace, "--wait=false")
        wait_admitted_on_gpus(cluster, namespace, "second")

        # A reconcile of the admitted job (a label change) leaves it running on the same Ray cluster.
        running_on = [c["metadata"]["uid"] for c in ray_clusters(cluster, namespace, "second")]
        cluster.kubectl("label", "llmtj", "second", "-n", namespace, "team=nlp")
        wait_for(
            lambda: (handled_labels(cluster, namespace, "second") or {}).get("team") == "nlp",
            what="the operator handling the label change",
        )

        def second_runs() -> None:
            assert rayjob(cluster, namespace, "second")["spec"].get("suspend") is not True
            assert [c["metadata"]["uid"] for c in ray_clusters(cluster, namespace, "second")] == running_on
            assert job_status(cluster, namespace, "second").get("phase") == "Running"

        hold(second_runs)
        assert suspend_history(watch, "second", since) == [True, False], writers(watch, "second", since)
        assert suspend_history(watch, "second", 0) == [True, False], writers(watch, "second", 0)


def test_kueue_preempts_a_running_job_for_a_higher_priority_one_and_resumes_it(
    cluster: Cluster, queue: Queue, namespace: str
) -> None:
    """The priority reaches Kueue through spec.resources.priorityClassName: Kueue reads the Ray
    pods' PriorityClass when the RayJob has no WorkloadPriorityClass label (the operator gives it
    none; the job has no field for one)."""
    queue.apply(gpus=8, preemption={"withinClusterQueue": "LowerPriority"})
    high = queue.priority_class(1000)
    with Watch(cluster, "rayjobs", namespace) as watch:
        apply_doc(cluster, gpu_job("low", namespace))
        wait_admitted_on_gpus(cluster, namespace, "low")
        since = mark(cluster, watch, namespace, "low")
        preempted_cluster = ray_clusters(cluster, namespace, "low")[0]["metadata"]["name"]

        apply_doc(cluster, gpu_job("urgent", namespace, priority_class=high))
        urgent = wait_for(lambda: workload(cluster, namespace, "urgent"), what="the urgent job's Workload")
        assert urgent["spec"]["priority"] == 1000, urgent["spec"]
        assert PRIORITY_LABEL not in rayjob(cluster, namespace, "urgent")["metadata"]["labels"]

        wait_for(
            lambda: condition(workload(cluster, namespace, "low"), "Preempted").get("status") == "True",
            what="Kueue preempting the low-priority job",
        )
        wait_admitted_on_gpus(cluster, namespace, "urgent")
        wait_queued(cluster, namespace, "low")
        assert get(cluster, "raycluster", preempted_cluster, namespace) is None

        def low_waits() -> None:
            assert_queued(cluster, namespace, "low")
            assert job_status(cluster, namespace, "urgent").get("phase") == "Running"

        hold(low_waits)

        cluster.kubectl("delete", "llmtj", "urgent", "-n", namespace, "--wait=false")
        wait_admitted_on_gpus(cluster, namespace, "low")
        assert ray_clusters(cluster, namespace, "low")[0]["metadata"]["name"] != preempted_cluster
        # Preempted, admitted again: Kueue's two writes and nobody else's.
        assert suspend_history(watch, "low", since) == [False, True, False], writers(watch, "low", since)


def _suspend(cluster: Cluster, namespace: str, name: str, value: bool) -> None:
    patch = json.dumps({"spec": {"runPolicy": {"suspend": value}}})
    cluster.kubectl("patch", "llmtj", name, "-n", namespace, "--type=merge", "-p", patch)


def _active(cluster: Cluster, namespace: str, name: str) -> bool:
    wl = workload(cluster, namespace, name)
    assert wl is not None
    return bool(wl["spec"].get("active", True))


def assert_suspended_by_user(cluster: Cluster, namespace: str, name: str) -> bool:
    """Its Workload deactivated (no quota held), nothing of it running, and the status says the
    user's suspend holds it, not the queue."""
    assert not _active(cluster, namespace, name)
    assert condition(workload(cluster, namespace, name), "Admitted").get("status") != "True"
    assert rayjob(cluster, namespace, name)["spec"].get("suspend") is True
    assert not ray_clusters(cluster, namespace, name)
    assert not items(cluster, "pods", namespace, f"llmtrain.dev/job={name}")
    status = job_status(cluster, namespace, name)
    assert status.get("phase") == "Suspended", status
    assert status["message"].startswith("suspended (runPolicy.suspend)"), status
    assert LOCAL_QUEUE in status["message"], status
    return True


def test_a_users_suspend_of_a_queued_job_deactivates_its_workload_and_resume_queues_it_again(
    cluster: Cluster, queue: Queue, namespace: str
) -> None:
    """Kueue owns a queued RayJob's `suspend`; the operator honours runPolicy.suspend the way Kueue
    expects, through the Workload's `spec.active`: Kueue evicts the job and frees its quota for
    others, and re-admits it when the suspend is lifted. Before, the suspend of a queued job did
    nothing at all (the job kept its GPUs)."""
    queue.apply(gpus=8)
    with Watch(cluster, "rayjobs", namespace) as watch:
        apply_doc(cluster, gpu_job("llama", namespace))
        first = wait_admitted_on_gpus(cluster, namespace, "llama")["rayClusterName"]
        since = mark(cluster, watch, namespace, "llama")

        _suspend(cluster, namespace, "llama", True)
        wait_for(lambda: assert_suspended_by_user(cluster, namespace, "llama"), what="suspended via Kueue")
        # The freed quota admits another job meanwhile.
        apply_doc(cluster, gpu_job("other", namespace))
        wait_admitted_on_gpus(cluster, namespace, "other")
        hold(lambda: assert_suspended_by_user(cluster, namespace, "llama"))
        cluster.kubectl("delete", "llmtj", "other", "-n", namespace, "--wait=false")

        _suspend(cluster, namespace, "llama", False)
        status = wait_admitted_on_gpus(cluster, namespace, "llama")
        assert _active(cluster, namespace, "llama")
        assert status["rayClusterName"] != first  # a new Ray cluster, resuming from the checkpoint
        # Kueue wrote every flip of the RayJob's suspend (evict, re-admit); the operator none.
        assert suspend_history(watch, "llama", since) == [False, True, False], writers(watch, "llama", since)
        managers = {
            m["manager"]
            for v in watch.versions("llama")[since:]
            for m in v["metadata"].get("managedFields") or []
            if "f:suspend" in json.dumps(m.get("fieldsV1", {}))
        }
        assert not any("llmtrain" in m or "kopf" in m for m in managers), managers


def test_a_queued_job_created_suspended_is_never_admitted_until_resumed(
    cluster: Cluster, queue: Queue, namespace: str
) -> None:
    """Given to Kueue only when resumed: with quota free, Kueue would admit it (and start its GPU
    workers) before its Workload could be deactivated."""
    queue.apply(gpus=16)  # quota enough: only the user's suspend holds it
    doc = gpu_job("held", namespace)
    doc["spec"]["runPolicy"]["suspend"] = True
    with Watch(cluster, "rayjobs", namespace) as watch:
        apply_doc(cluster, doc)

        def held() -> bool:
            obj = rayjob(cluster, namespace, "held")
            assert obj["spec"].get("suspend") is True and QUEUE_LABEL not in obj["metadata"]["labels"]
            assert workload(cluster, namespace, "held") is None
            assert not items(cluster, "pods", namespace, "llmtrain.dev/job=held")
            assert job_status(cluster, namespace, "held").get("phase") == "Suspended"
            return True

        wait_for(held, what="held by its user")
        hold(held)
        _suspend(cluster, namespace, "held", False)
        wait_admitted_on_gpus(cluster, namespace, "held")
        assert rayjob(cluster, namespace, "held")["metadata"]["labels"][QUEUE_LABEL] == LOCAL_QUEUE
        assert suspend_history(watch, "held", 0) == [True, False], writers(watch, "held", 0)


def test_a_workload_kueue_deactivated_stays_inactive_and_fails_the_job(
    cluster: Cluster, queue: Queue, operator: OperatorProcess, namespace: str
) -> None:
    """Kueue deactivates a Workload itself when its maximum execution time has passed (an
    administrator set it with Kueue's `max-exec-time-seconds` label on the RayJob, read when the
    Workload is made): it sets `spec.active: false` and evicts it with reason
    `DeactivatedDueToMaximumExecutionTimeExceeded`. Before, the job then read "queued … waiting for
    quota", and any reconcile (a label edit, an operator restart) set the Workload active again,
    handing the job GPUs once more. Now the job fails naming Kueue's cause, and stays so."""
    queue.apply(gpus=8)
    doc = gpu_job("capped", namespace)
    doc["spec"]["runPolicy"]["suspend"] = True  # held: its Workload is made only at the resume
    apply_doc(cluster, doc)
    wait_for(lambda: job_status(cluster, namespace, "capped").get("phase") == "Suspended", what="held")
    cluster.kubectl("label", "rayjob", "capped", "-n", namespace, f"{MAX_EXEC_LABEL}=5")
    _suspend(cluster, namespace, "capped", False)

    def evicted_by_kueue() -> bool:
        wl = workload(cluster, namespace, "capped")
        reason = condition(wl, "Evicted").get("reason")
        return not _active(cluster, namespace, "capped") and reason == (
            "DeactivatedDueToMaximumExecutionTimeExceeded"
        )

    # Admitted (Kueue counts execution time only while admitted, so an eviction for it means the
    # job was): on a loaded machine the 5 s can pass before the job reads Running, which a wait
    # for Running then never saw.
    wait_for(
        lambda: (
            condition(workload(cluster, namespace, "capped"), "Admitted").get("status") == "True"
            or evicted_by_kueue()
        ),
        what="Kueue admitting the Workload",
    )

    wait_for(evicted_by_kueue, what="Kueue deactivating the Workload past its maximum execution time")
    status = wait_phase(cluster, namespace, "capped", "Failed")
    assert "MaximumExecutionTimeExceeded" in status["message"], status
    assert condition({"status": status}, "Failed").get("reason") == "KueueDeactivated", status

    # A reconcile (a label edit) and an operator restart: the Workload stays inactive, nothing of the
    # job runs again, and the job stays Failed. A finished job is labelled out of the operator's
    # watch; the edit drops that label, as a GitOps re-apply may, so the operator handles it.
    wait_for(
        lambda: (
            (get(cluster, "llmtj", "capped", namespace) or {})["metadata"]
            .get("labels", {})
            .get(FINISHED_LABEL)
        ),
        what="the finished job labelled",
    )
    cluster.kubectl("label", "llmtj", "capped", "-n", namespace, "touched=1", f"{FINISHED_LABEL}-")
    wait_for(
        lambda: (handled_labels(cluster, namespace, "capped") or {}).get("touched") == "1",
        what="the operator handling the label edit",
    )
    operator.restart()

    def stays_stopped() -> None:
        assert not _active(cluster, namespace, "capped")
        assert condition(workload(cluster, namespace, "capped"), "Admitted").get("status") != "True"
        assert rayjob(cluster, namespace, "capped")["spec"].get("suspend") is True
        assert not items(cluster, "pods", namespace, "llmtrain.dev/job=capped")
        assert job_status(cluster, namespace, "capped").get("phase") == "Failed"

    wait_for(lambda: stays_stopped() or True, what="the job's Ray cluster gone")
    hold(stays_stopped, seconds=2 * HOLD_SECONDS)


def test_a_jobs_workload_priority_class_and_topology_request_reach_kueues_workload(
    cluster: Cluster, queue: Queue, namespace: str
) -> None:
    """runPolicy.workloadPriorityClass sets the Workload's priority from a Kueue WorkloadPriorityClass
    (apart from the pods' PriorityClass), and resources.topology becomes the workers' podset
    topology request, both read by the real Kueue from what the operator rendered."""
    queue.apply(gpus=4)  # the worker needs 8: the Workload waits, as made
    wpc = f"{namespace}-wpc"[:63]
    cluster.apply(
        [
            {
                "apiVersion": API,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": wpc},
                "value": 4242,
                "description": "a test's Kueue priority",
            }
        ]
    )
    try:
        doc = gpu_job("ranked", namespace)
        doc["spec"]["runPolicy"]["workloadPriorityClass"] = wpc
        doc["spec"]["resources"]["topology"] = {"preferred": "kubernetes.io/hostname"}
        apply_doc(cluster, doc)
        wl = wait_for(lambda: workload(cluster, namespace, "ranked"), what="the job's Workload")
        assert wl["spec"]["priority"] == 4242, wl["spec"]
        assert wl["spec"]["priorityClassRef"]["name"] == wpc, wl["spec"]
        assert wl["spec"]["priorityClassRef"]["group"] == "kueue.x-k8s.io", wl["spec"]
        sets = {p["name"]: p for p in wl["spec"]["podSets"]}
        workers = [p for name, p in sets.items() if name != "head" and name != "submitter"]
        requests = [(p.get("topologyRequest") or {}) for p in workers]
        assert [(r.get("preferred"), r.get("required")) for r in requests] == [
            ("kubernetes.io/hostname", None)
        ], sets
        assert "topologyRequest" not in sets["head"], sets["head"]
    finally:
        cluster.kubectl("delete", "llmtj", "--all", "-n", namespace, "--wait=false")
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", f"workloadpriorityclass/{wpc}")


def test_a_job_kueue_manages_without_a_queue_name_is_left_to_kueue(
    cluster: Cluster, queue: Queue, operator: OperatorProcess, namespace: str
) -> None:
    """With Kueue's manageJobsWithoutQueueName (Kueue restarted with it for this test), its webhook
    suspends a RayJob that has no queue label and no default LocalQueue, and Kueue makes a
    Workload that waits. Before, the operator saw no queue label and wrote `suspend: false` at the
    next reconcile (a label edit, a restart), and KubeRay started GPU workers outside any quota
    until Kueue suspended the RayJob again; the job read "suspended" by its user."""
    doc = gpu_job("unqueued", namespace)
    del doc["spec"]["runPolicy"]["queueName"]
    with (
        kueue_configured(cluster.directory, {"manageJobsWithoutQueueName": True}),
        Watch(cluster, "rayjobs", namespace) as watch,
    ):
        apply_doc(cluster, doc)
        wait_for(lambda: workload(cluster, namespace, "unqueued"), what="Kueue's Workload of the job")

        def left_to_kueue() -> bool:
            obj = rayjob(cluster, namespace, "unqueued")
            assert obj["spec"].get("suspend") is True and QUEUE_LABEL not in obj["metadata"]["labels"]
            assert not items(cluster, "pods", namespace, "llmtrain.dev/job=unqueued")
            status = job_status(cluster, namespace, "unqueued")
            assert status.get("phase") == "Pending", status
            assert status["message"].startswith("queued in Kueue (it manages jobs without a queue name"), (
                status
            )
            return True

        wait_for(left_to_kueue, what="the job left queued to Kueue")
        cluster.kubectl("label", "llmtj", "unqueued", "-n", namespace, "touched=1")
        wait_for(
            lambda: (handled_labels(cluster, namespace, "unqueued") or {}).get("touched") == "1",
            what="the operator handling the label edit",
        )
        operator.restart()
        hold(left_to_kueue, seconds=2 * HOLD_SECONDS)
        history = suspend_history(watch, "unqueued", 0)
        assert history == [True], writers(watch, "unqueued", 0)
        cluster.kubectl("delete", "llmtj", "unqueued", "-n", namespace, "--wait=false")
        wait_for(lambda: get(cluster, "rayjob", "unqueued", namespace) is None, what="the RayJob gone")
