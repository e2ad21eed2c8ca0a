"""What keeps a job's Ray cluster from starting (`diagnosis.diagnose`, pure), its start-up deadline
(`diagnosis.startup_expired`), and the status they make (`status.operator_status` with `Startup`).
Pods, Events and nodes are written as the kubelet, the scheduler and KubeRay write them."""

from __future__ import annotations

from typing import Any

import pytest
from llmtrain.api.spec import STARTUP_BACKSTOP_SECONDS
from llmtrain.api.validation import parse_job
from llmtrain.constants import FINISHED_LABEL, JOB_LABEL, KUEUE_QUEUE_LABEL, ROLE_LABEL
from llmtrain.operator.children import drift_patch
from llmtrain.operator.diagnosis import Diagnosis, diagnose, startup_expired
from llmtrain.operator.startup import deadline_seconds, stopped
from llmtrain.operator.status import (
    Announcement,
    Startup,
    Step,
    operator_status,
    recorded_diagnosis,
    startup_failed,
)
from llmtrain.render.rayjob import ImageSettings, render_rayjob

from tests.support.jobs import minimal_job

GPU = "nvidia.com/gpu"
SCHEDULER_GPU = (
    "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 Insufficient nvidia.com/gpu. "
    "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
)


def pod(
    name: str,
    *,
    role: str = "worker",
    image: str = "ghcr.io/x/trainer:1",
    gpus: int = 0,
    selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    waiting: tuple[str, str] | None = None,
    unschedulable: str | None = None,
) -> dict[str, Any]:
    limits = {"cpu": "8", "memory": "64Gi", **({GPU: str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "ray-worker", "image": image, "resources": {"limits": limits, "requests": limits}}
        ],
        "nodeSelector": selector or {},
        "tolerations": tolerations or [],
    }
    status: dict[str, Any] = {"phase": "Pending", "conditions": []}
    if waiting:
        status["containerStatuses"] = [
            {
                "name": "ray-worker",
                "image": image,
                "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}},
            }
        ]
    if unschedulable is not None:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    meta = {"name": name, "uid": f"uid-{name}", "labels": {JOB_LABEL: "j", ROLE_LABEL: role}}
    return {"metadata": meta, "spec": spec, "status": status}


def node(
    name: str, *, gpus: int = 0, labels: dict[str, str] | None = None, taint: bool = True
) -> dict[str, Any]:
    allocatable = {"cpu": "192", "memory": "2Ti", **({GPU: str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {}
    if gpus and taint:
        spec["taints"] = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": allocatable},
    }


GPU_TOLERATION = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
NODES = [node("gpu-0", gpus=8), node("gpu-1", gpus=8), node("cpu-0")]


def test_an_image_that_cannot_be_pulled_is_named() -> None:
    for reason in ("ErrImagePull", "ImagePullBackOff"):
        pods = [pod("w-1", image="registry.invalid/t:nope", waiting=(reason, 'Back-off pulling image "x"'))]
        found = diagnose(pods, [], NODES)
        assert found is not None and found.reason == "ImagePullFailed"
        assert 'image "registry.invalid/t:nope" cannot be pulled' in found.message, found
        assert "pod w-1" in found.message


def test_a_missing_secret_in_an_env_reference_is_named() -> None:
    pods = [pod("w-1", waiting=("CreateContainerConfigError", 'secret "hf-token" not found'))]
    assert diagnose(pods, [], NODES) == Diagnosis(
        "MissingSecret", 'Secret "hf-token" (referenced by an env variable) does not exist (pod w-1)'
    )


def test_a_missing_key_and_a_missing_configmap_volume_are_named() -> None:
    key = pod("w-1", waiting=("CreateContainerConfigError", "couldn't find key token in Secret ns/hf"))
    found = diagnose([key], [], NODES)
    assert (
        found is not None
        and found.reason == "MissingSecretKey"
        and "Secret hf has no key token" in found.message
    )
    mounting = pod("w-2", waiting=("ContainerCreating", ""))
    event = {
        "type": "Warning",
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "extra" : configmap "extra-cm" not found',
        "involvedObject": {"kind": "Pod", "name": "w-2", "uid": "uid-w-2"},
    }
    found = diagnose([mounting], [event], NODES)
    assert (
        found is not None and found.reason == "MissingConfigMap" and 'ConfigMap "extra-cm"' in found.message
    )
    assert diagnose([mounting], [], NODES) is None, "a container being created is no cause"


def test_more_gpus_than_any_node_has_names_the_numbers() -> None:
    pods = [pod("w-1", gpus=16, tolerations=GPU_TOLERATION, unschedulable=SCHEDULER_GPU)]
    found = diagnose(pods, [], NODES)
    assert found is not None and found.reason == "InsufficientGPU"
    numbers = "the most any of the 3 nodes it may run on can allocate is 8 (16 on them all)"
    assert f"it requests 16 {GPU}, but {numbers}" in found.message, found


def test_gpus_a_node_has_but_not_free_say_they_are_in_use() -> None:
    pods = [
        pod(
            "w-1",
            gpus=8,
            tolerations=GPU_TOLERATION,
            selector={"nvidia.com/gpu.present": "true"},
            unschedulable=SCHEDULER_GPU,
        )
    ]
    nodes = [node(n, gpus=8, labels={"nvidia.com/gpu.present": "true"}) for n in ("gpu-0", "gpu-1")] + [
        node("cpu-0")
    ]
    found = diagnose(pods, [], nodes)
    assert found is not None and found.reason == "InsufficientGPU"
    assert f"it requests 8 {GPU}; 2 of the 2 nodes it may run on can allocate that many" in found.message
    assert "in use by other pods" in found.message


def test_a_selector_no_node_matches_names_the_labels_and_the_nodes_checked() -> None:
    selector = {"nvidia.com/gpu.product": "NVIDIA-B200"}
    pods = [pod("w-1", gpus=8, selector=selector, tolerations=GPU_TOLERATION, unschedulable="0/3 nodes ...")]
    found = diagnose(pods, [], NODES)
    assert found == Diagnosis(
        "NoMatchingNode",
        "no node has the labels its nodeSelector asks for "
        "(nvidia.com/gpu.product=NVIDIA-B200; 3 nodes checked) (pod w-1)",
    )


def test_an_untolerated_taint_is_named() -> None:
    selector = {"pool": "gpu"}
    nodes = [node("gpu-0", gpus=8, labels=selector), node("cpu-0")]
    pods = [pod("h-1", role="head", selector=selector, unschedulable="0/2 nodes ... untolerated taint")]
    found = diagnose(pods, [], nodes)
    assert found is not None and found.reason == "UntoleratedTaint"
    assert f"have taints it does not tolerate: {GPU}=present:NoSchedule" in found.message
    # Equal tolerates the taint's value only.
    other = [{"key": GPU, "operator": "Equal", "value": "other", "effect": "NoSchedule"}]
    found = diagnose([pod("h-1", selector=selector, tolerations=other, unschedulable="...")], [], nodes)
    assert found is not None and found.reason == "UntoleratedTaint"
    same = [{"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    found = diagnose([pod("h-1", selector=selector, tolerations=same, unschedulable="...")], [], nodes)
    assert found is not None and found.reason != "UntoleratedTaint"


def test_without_node_rights_the_schedulers_words_stand() -> None:
    pods = [pod("w-1", gpus=16, tolerations=GPU_TOLERATION, unschedulable=SCHEDULER_GPU)]
    found = diagnose(pods, [], None)
    assert found is not None and found.reason == "InsufficientGPU" and SCHEDULER_GPU in found.message


def test_a_quota_that_refuses_the_pods_is_named_with_its_numbers() -> None:
    refusal = (
        'Failed to create worker Pod for the cluster ns/c-1, pods "c-1-worker-x" is forbidden: exceeded '
        "quota: gpus, requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8, limited: "
        "requests.nvidia.com/gpu=8"
    )
    old = {
        "type": "Warning",
        "reason": "FailedToCreateWorkerPod",
        "message": "older",
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }
    events = [
        {**old, "involvedObject": {"kind": "RayCluster", "name": "c-1"}},
        {
            "type": "Warning",
            "reason": "FailedToCreateWorkerPod",
            "message": refusal,
            "lastTimestamp": "2026-01-01T00:01:00Z",
            "involvedObject": {"kind": "RayCluster", "name": "c-1"},
        },
        {
            **old,
            "message": refusal.replace("gpus", "other"),
            "involvedObject": {"kind": "RayCluster", "name": "c-2"},
        },
    ]
    found = diagnose([], events, NODES, "c-1")
    assert found is not None and found.reason == "QuotaExceeded"
    assert (
        "exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8"
        in found.message
    )


def test_pods_with_the_same_cause_are_counted_once_and_the_commonest_cause_leads() -> None:
    pull = ("ImagePullBackOff", "")
    pods = [
        pod("h-1", role="head", waiting=("CreateContainerConfigError", 'secret "s" not found')),
        pod("w-1", waiting=pull),
        pod("w-2", waiting=pull),
        pod("w-3", waiting=pull),
    ]
    found = diagnose(pods, [], NODES)
    assert found is not None and found.reason == "ImagePullFailed"
    assert "(3 pods: w-1, w-2, ...)" in found.message and 'Secret "s"' in found.message
    assert diagnose([pod("w-1")], [], NODES) is None


START = "2026-11-26T10:00:00Z"


def rayjob(
    deployment: str, *, reason: str = "", start: str | None = START, queued: bool = False
) -> dict[str, Any]:
    labels = {KUEUE_QUEUE_LABEL: "q"} if queued else {}
    status = {"jobDeploymentStatus": deployment, "reason": reason, "rayClusterName": "c-1"}
    if start:
        status["startTime"] = start
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "j", "namespace": "n", "labels": labels, "uid": "r-uid"},
        "spec": {"suspend": False, "ttlSecondsAfterFinished": 300},
        "status": status,
    }


@pytest.mark.parametrize(
    ("deployment", "reason", "now", "expired"),
    [
        ("Initializing", "", "2026-11-26T10:09:59Z", False),
        ("Initializing", "", "2026-11-26T10:10:00Z", True),
        ("Waiting", "", "2026-11-26T10:10:01Z", True),
        ("Running", "", "2026-11-26T11:00:00Z", False),
        ("Suspended", "", "2026-11-26T11:00:00Z", False),
        ("Retrying", "PreRunningDeadlineExceeded", "2026-11-26T10:00:01Z", True),
        ("Failed", "PreRunningDeadlineExceeded", "2026-11-26T10:00:01Z", True),
        ("Retrying", "AppFailed", "2026-11-26T11:00:00Z", False),
    ],
)
def test_the_deadline_counts_from_the_attempts_start_time(
    deployment: str, reason: str, now: str, expired: bool
) -> None:
    assert startup_expired(rayjob(deployment, reason=reason), 600, now) is expired


def job(status: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"name": "j", "namespace": "n", "uid": "u", "generation": 1, "resourceVersion": "1"}
    return {"metadata": meta, "spec": {"runPolicy": {"startupDeadlineSeconds": 600}}, "status": status or {}}


CAUSE = Diagnosis("ImagePullFailed", 'image "x" cannot be pulled (ImagePullBackOff) (pod w-1)')


def test_a_blocked_start_names_its_cause_and_when_it_fails() -> None:
    said = operator_status(
        job({"phase": "Initializing"}),
        rayjob("Initializing"),
        Step.MIRRORED,
        "2026-11-26T10:01:00Z",
        Startup(600, CAUSE),
    )
    update = said.update
    assert update["phase"] == "Initializing"
    assert CAUSE.message in update["message"] and "fails at 2026-11-26T10:10:00Z" in update["message"]
    blocked = next(c for c in update["conditions"] if c["type"] == "StartupBlocked")
    assert (blocked["status"], blocked["reason"]) == ("True", "ImagePullFailed")
    assert said.event is not None and said.event.reason == "ImagePullFailed" and said.announce == "write"
    assert not said.stop_rayjob
    # Started: the condition turns False.
    later = operator_status(
        job(update), rayjob("Running"), Step.MIRRORED, "2026-11-26T10:02:00Z", Startup(600)
    )
    blocked = next(c for c in later.update["conditions"] if c["type"] == "StartupBlocked")
    assert later.update["phase"] == "Running" and blocked["status"] == "False"


def test_at_the_deadline_the_job_fails_naming_the_last_cause_seen_and_its_rayjob_is_stopped() -> None:
    blocked = operator_status(
        job({"phase": "Initializing"}),
        rayjob("Initializing"),
        Step.MIRRORED,
        "2026-11-26T10:01:00Z",
        Startup(600, CAUSE),
    ).update
    # KubeRay's own deadline fired and it is deleting the cluster: the pods are gone, no fresh cause.
    said = operator_status(
        job(blocked),
        rayjob("Retrying", reason="PreRunningDeadlineExceeded"),
        Step.MIRRORED,
        "2026-11-26T10:10:01Z",
        Startup(600),
    )
    assert said.update["phase"] == "Failed" and said.stop_rayjob
    assert (
        "runPolicy.startupDeadlineSeconds (600 s)" in said.update["message"]
        and CAUSE.message in said.update["message"]
    )
    failed = next(c for c in said.update["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "StartupDeadlineExceeded")
    assert said.event is not None and said.event.reason == "StartupDeadlineExceeded"
    # The operator's own clock, for a KubeRay without the field.
    own = operator_status(
        job(blocked), rayjob("Initializing"), Step.MIRRORED, "2026-11-26T10:10:00Z", Startup(600)
    )
    assert own.update["phase"] == "Failed" and own.stop_rayjob
    # Failed stays Failed while KubeRay suspends the RayJob.
    assert startup_failed(said.update)
    after = operator_status(
        job(said.update), rayjob("Suspending"), Step.MIRRORED, "2026-11-26T10:10:05Z", Startup(600)
    )
    assert after.update == {}


def _condition(update: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in update["conditions"] if c["type"] == ctype), None)


def test_startup_blocked_keeps_its_time_while_the_cause_stays_and_turns_false_once_started() -> None:
    """The Warning goes out when a cause is first written, not on every look; the condition keeps
    the time the cause was first seen; once the cluster runs it turns False (NoCauseFound)."""
    created = {"type": "Created", "status": "True", "reason": "RayJobCreated", "message": ""}
    created["lastTransitionTime"] = "2026-11-26T09:59:00Z"
    t1, t2, t3 = "2026-11-26T10:01:00Z", "2026-11-26T10:02:00Z", "2026-11-26T10:03:00Z"
    first = operator_status(
        job({"conditions": [created]}), rayjob("Initializing"), Step.MIRRORED, t1, Startup(600, CAUSE)
    )
    message = (
        f"Ray cluster is starting; waiting: {CAUSE.message}; it fails at 2026-11-26T10:10:00Z if it "
        "has not started (runPolicy.startupDeadlineSeconds)"
    )
    assert (first.update["phase"], first.update["message"]) == ("Initializing", message)
    assert first.event == Announcement("Warning", "ImagePullFailed", f"phase None → Initializing: {message}")
    assert first.announce == "write"
    blocked = {
        "type": "StartupBlocked",
        "status": "True",
        "reason": "ImagePullFailed",
        "message": CAUSE.message,
    }
    assert _condition(first.update, "StartupBlocked") == {
        **blocked,
        "lastTransitionTime": t1,
        "observedGeneration": 1,
    }
    assert _condition(first.update, "Created") == {**created, "observedGeneration": 1}
    again = operator_status(job(first.update), rayjob("Initializing"), Step.MIRRORED, t2, Startup(600, CAUSE))
    assert again.event == Announcement(
        "Warning", "ImagePullFailed", f"phase Initializing → Initializing: {message}"
    )
    assert again.announce == "phase"
    assert _condition(again.update, "StartupBlocked") == {
        **blocked,
        "lastTransitionTime": t1,
        "observedGeneration": 1,
    }
    # Running: a cause found now is not the job's; the condition turns False.
    started = operator_status(job(again.update), rayjob("Running"), Step.MIRRORED, t3, Startup(600, CAUSE))
    assert (started.update["phase"], started.update["message"]) == ("Running", "training")
    assert _condition(started.update, "StartupBlocked") == {
        "type": "StartupBlocked",
        "status": "False",
        "reason": "NoCauseFound",
        "message": "",
        "lastTransitionTime": t3,
        "observedGeneration": 1,
    }


def test_a_job_never_blocked_has_no_startup_condition_and_a_retry_is_not_a_blocked_start() -> None:
    running = operator_status(job(), rayjob("Running"), Step.MIRRORED, "2026-11-26T10:01:00Z", Startup(600))
    assert running.update["phase"] == "Running" and _condition(running.update, "StartupBlocked") is None
    retry = operator_status(
        job({"phase": "Running"}),
        rayjob("Retrying"),
        Step.MIRRORED,
        "2026-11-26T10:01:00Z",
        Startup(600, CAUSE),
    )
    assert (
        retry.update["message"]
        == "retrying on a new Ray cluster; training resumes from the latest checkpoint"
    )
    assert retry.event is not None and retry.event.reason == "Retrying"
    assert _condition(retry.update, "StartupBlocked") is None
    # Without KubeRay's startTime the deadline is unknown: the message names no time.
    unknown = operator_status(
        job(), rayjob("Initializing", start=None), Step.MIRRORED, "2026-11-26T10:01:00Z", Startup(600, CAUSE)
    )
    assert unknown.update["message"] == f"Ray cluster is starting; waiting: {CAUSE.message}"


def test_a_job_failed_at_its_deadline_says_why_in_its_message_event_and_conditions() -> None:
    now = "2026-11-26T10:10:00Z"
    said = operator_status(
        job({"phase": "Initializing"}), rayjob("Initializing"), Step.MIRRORED, now, Startup(600, CAUSE)
    )
    message = (
        f"the Ray cluster did not start within runPolicy.startupDeadlineSeconds (600 s): {CAUSE.message}; "
        "its Ray cluster is stopped and the job is not retried"
    )
    assert (said.update["phase"], said.update["message"]) == ("Failed", message)
    assert said.event == Announcement("Warning", "StartupDeadlineExceeded", message)
    assert said.announce == "write" and said.stop_rayjob
    assert _condition(said.update, "Failed") == {
        "type": "Failed",
        "status": "True",
        "reason": "StartupDeadlineExceeded",
        "message": message,
        "lastTransitionTime": now,
        "observedGeneration": 1,
    }
    assert _condition(said.update, "StartupBlocked") == {
        "type": "StartupBlocked",
        "status": "True",
        "reason": "ImagePullFailed",
        "message": CAUSE.message,
        "lastTransitionTime": now,
        "observedGeneration": 1,
    }
    # Nothing ever found: the message says so, and no StartupBlocked is written.
    unexplained = operator_status(job(), rayjob("Initializing"), Step.MIRRORED, now, Startup(600))
    assert unexplained.update["message"] == (
        "the Ray cluster did not start within runPolicy.startupDeadlineSeconds (600 s): no cause found "
        "in its pods and their Events; its Ray cluster is stopped and the job is not retried"
    )
    assert _condition(unexplained.update, "StartupBlocked") is None


def test_at_the_deadline_the_cause_recorded_earlier_is_the_one_reported() -> None:
    recorded = {
        "type": "StartupBlocked",
        "status": "True",
        "reason": "ImagePullFailed",
        "message": CAUSE.message,
    }
    status = {
        "phase": "Initializing",
        "conditions": [{**recorded, "lastTransitionTime": "2026-11-26T10:01:00Z"}],
    }
    said = operator_status(
        job(status), rayjob("Initializing"), Step.MIRRORED, "2026-11-26T10:10:00Z", Startup(600)
    )
    assert _condition(said.update, "StartupBlocked") == {
        **recorded,
        "lastTransitionTime": "2026-11-26T10:01:00Z",
        "observedGeneration": 1,
    }
    assert recorded_diagnosis({"conditions": [{**recorded, "message": None}]}) == Diagnosis(
        "ImagePullFailed", ""
    )
    assert recorded_diagnosis({"conditions": [{**recorded, "status": "False"}]}) is None


def test_a_stopped_rayjob_is_suspended_unless_kueue_owns_suspend_and_an_edit_never_resumes_it() -> None:
    doc = minimal_job("j", "n", runPolicy={"startupDeadlineSeconds": 30})
    doc["metadata"]["uid"] = "u"
    parsed = parse_job(doc)
    assert deadline_seconds(doc) == 30 and deadline_seconds(minimal_job()) == 900
    desired = render_rayjob(parsed, ImageSettings())
    assert desired["spec"]["preRunningDeadlineSeconds"] == 30 + STARTUP_BACKSTOP_SECONDS
    existing = {**desired, "spec": {**desired["spec"], "suspend": True, "ttlSecondsAfterFinished": 0}}
    assert drift_patch(stopped(desired), existing) == {}, "the stopped form keeps it suspended"
    assert drift_patch(desired, existing)["spec"]["suspend"] is False, "the plain render would resume it"
    queued = rayjob("Initializing", queued=True)
    assert "suspend" not in {k for k, v in stopped(queued)["spec"].items() if v is True}


class FakeKube:
    """Records the reads and writes `startup.mirror` makes; pods are unschedulable for 16 GPUs."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []

    def list_all(
        self, res: Any, namespace: Any, label_selector: Any = None, **_: Any
    ) -> list[dict[str, Any]]:
        self.listed.append(res.plural)
        if res.plural == "pods":
            return [pod("w-1", gpus=16, tolerations=GPU_TOLERATION, unschedulable=SCHEDULER_GPU)]
        return NODES if res.plural == "nodes" else []

    def merge_patch(
        self, res: Any, namespace: str, name: str, body: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        self.patched.append((res.plural, body))
        return {}

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return obj


def test_a_young_attempt_is_not_looked_into_an_older_one_is_and_an_expired_one_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmtrain.operator import reporting, startup

    kube = FakeKube()
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:00:05Z")
    startup.mirror(kube, job({"phase": "Initializing"}), rayjob("Initializing"))  # type: ignore[arg-type]
    assert kube.listed == [], "a 5 s old attempt costs no reads"
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:00:11Z")
    startup.mirror(kube, job({"phase": "Initializing"}), rayjob("Initializing"))  # type: ignore[arg-type]
    assert kube.listed == ["pods", "events", "nodes"]
    status = [body for plural, body in kube.patched if plural == "llmtrainingjobs"][-1]
    assert f"it requests 16 {GPU}" in status["status"]["message"]
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:10:00Z")
    startup.mirror(kube, job(status["status"]), rayjob("Initializing"))  # type: ignore[arg-type]
    stops = [body for plural, body in kube.patched if plural == "rayjobs"]
    # Stopped, and only then labelled finished (out of Kopf's view and the resync's, nothing
    # would stop it later): the job last.
    label = {"metadata": {"labels": {FINISHED_LABEL: "true"}}}
    assert stops == [{"spec": {"ttlSecondsAfterFinished": 0, "suspend": True}}, label], kube.patched
    assert kube.patched[-1] == ("llmtrainingjobs", label)


def test_a_rayjob_being_suspended_is_not_looked_into_nor_looked_at_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KubeRay marks a new RayJob Initializing (with a startTime) before it sees `suspend`; under a
    burst of queued jobs that lasts past LOOK_AFTER_SECONDS. No pods start: no reads, not noted."""
    from llmtrain.operator import reporting, startup

    monkeypatch.setattr(startup, "STARTING", startup.StartingJobs())
    kube = FakeKube()
    being_suspended = rayjob("Initializing")
    being_suspended["spec"]["suspend"] = True
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:00:30Z")
    startup.mirror(kube, job({"phase": "Initializing"}), being_suspended)  # type: ignore[arg-type]
    assert kube.listed == [], "a RayJob being suspended starts no pods: nothing to look into"
    assert startup.STARTING.items() == [], "nor is it looked at again between resyncs"
    # Past its deadline it is judged as any starting job (a look names the last cause).
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:10:00Z")
    startup.mirror(kube, job({"phase": "Initializing"}), being_suspended)  # type: ignore[arg-type]
    assert kube.listed == ["pods", "events", "nodes"]


class StoredKube(FakeKube):
    """FakeKube that also serves GETs of the job and its RayJob as stored now."""

    def __init__(self, job: dict[str, Any], rayjob: dict[str, Any] | None) -> None:
        super().__init__()
        self.stored = {"llmtrainingjobs": job, "rayjobs": rayjob}

    def get(self, res: Any, namespace: str, name: str) -> dict[str, Any]:
        from llmtrain.operator.kube import ApiError

        found = self.stored.get(res.plural)
        if found is None:
            raise ApiError(404, "NotFound", f"{res.plural} {name} not found")
        return found


def _owned(ray: dict[str, Any]) -> dict[str, Any]:
    ref = {"apiVersion": "llmtrain.dev/v1alpha1", "kind": "LLMTrainingJob", "name": "j", "uid": "u"}
    ray["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
    return ray


def test_a_starting_job_is_looked_at_again_between_resyncs_until_it_is_no_longer_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No RayJob event comes while pods wait on an image or a Secret: the start-up pass mirrors the
    job again on its own, and stops once the cluster is up or the RayJob is gone."""
    import logging

    from llmtrain.operator import mirror, reporting, startup

    monkeypatch.setattr(startup, "STARTING", startup.StartingJobs())
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:00:05Z")
    waiting = _owned(rayjob("Initializing"))
    startup.mirror(FakeKube(), job({"phase": "Initializing"}), waiting)  # type: ignore[arg-type]
    assert [key for key, _ in startup.STARTING.items()] == ["n/j"], "a starting job is noted"

    # Later, with no event: the pass reads the job and RayJob again and names the cause.
    monkeypatch.setattr(reporting, "now", lambda: "2026-11-26T10:00:30Z")
    kube = StoredKube(job({"phase": "Initializing"}), waiting)
    mirror.look_at_starting(kube, logging.getLogger("test"))  # type: ignore[arg-type]
    assert kube.listed == ["pods", "events", "nodes"]
    status = [body for plural, body in kube.patched if plural == "llmtrainingjobs"][-1]
    assert f"it requests 16 {GPU}" in status["status"]["message"]
    assert startup.STARTING.items(), "still starting: still looked at"

    # Its cluster came up: no more looks.
    kube = StoredKube(job({"phase": "Initializing"}), _owned(rayjob("Running")))
    mirror.look_at_starting(kube, logging.getLogger("test"))  # type: ignore[arg-type]
    assert startup.STARTING.items() == []
    mirror.look_at_starting(kube, logging.getLogger("test"))  # type: ignore[arg-type]
    assert kube.listed == [], "a running job costs the pass nothing"

    # A RayJob deleted meanwhile (or a job gone) leaves the set too.
    startup.mirror(FakeKube(), job({"phase": "Initializing"}), waiting)  # type: ignore[arg-type]
    mirror.look_at_starting(StoredKube(job({"phase": "Initializing"}), None), logging.getLogger("t"))  # type: ignore[arg-type]
    assert startup.STARTING.items() == []
