"""One job's life in real pods (issue #21, scenarios 3 and 4), in one run to keep the tier short:
each Ray cluster start costs minutes on two cores.

1. A worker pod is deleted mid-training: KubeRay re-creates it, Ray Train restarts its worker group
   (`runPolicy.maxWorkerFailures`) and the trainer resumes from the last checkpoint on the shared
   volume, losing at most one checkpoint interval, the loss carrying on.
2. Suspend removes every Ray pod; resume continues from the checkpoint taken before.
3. Deleting the job and applying another spec under the same name (the Hugging Face Trainer mode,
   scenario 6's other half) starts a new run with the new config: it does not silently resume (or
   report) the old one, nor train with the old config.

The job runs one worker with a head of a whole core (the README example's two workers of FSDP run
in test_tiny_cpu.py): its Ray cluster starts are most of the scenario's time, and the head (GCS,
the dashboard, the driver, Ray Train's controller; its limit is its request) at the example's 500m
took 75-110 s of each start from the submitter's start to the first step under load. The
re-created job has the same shape: its pods start once the earlier job's are gone.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from tests.pods import jobs
from tests.pods.conftest import Release, get
from tests.support.cluster.cluster import Cluster

NAME = "tiny-cpu-life"
EVERY = 20
# Long enough (about 0.2 s a step here) that the suspend lands while it trains, not after the end:
# it is asked for about 40 steps after the resume and lands some 50 steps later (the Ray pods get
# 5 s from SIGTERM to SIGKILL; with Kubernetes' default 30 s they trained on for 150-220 steps).
STEPS = 280
# One worker at the example's worker shape, the head with the second worker's CPU: 1.5 cores, and
# the submitter and the operator make 1.8 of the node's 2.
SHAPE = jobs.WHOLE_HEAD_SHAPE


def _progress(status: dict[str, Any]) -> dict[str, Any]:
    return status.get("progress") or {}


def _checkpoint_step(status: dict[str, Any]) -> int:
    return int((_progress(status).get("lastCheckpoint") or {}).get("step") or 0)


def _step(status: dict[str, Any]) -> int:
    return int(_progress(status).get("step") or 0)


def _resumed_steps(cluster: Cluster, namespace: str) -> list[int]:
    """The trainer's `[resumed] step N/...` records in the submitter's log (the driver's output)."""
    logs = cluster.kubectl("logs", "-n", namespace, "-l", "batch.kubernetes.io/job-name", "--tail=-1")
    return [int(s) for s in re.findall(r"\[resumed\] step (\d+)/", logs.stdout)]


def test_worker_loss_suspend_resume_and_recreate_in_real_pods(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    started = time.monotonic()
    watch = jobs.Watch(namespace, NAME, t0=started)
    jobs.seed_data(cluster, release, namespace)
    watch.mark("data seeded")
    job = jobs.variant(
        NAME,
        resources=SHAPE,
        training={"maxSteps": STEPS, "logEverySteps": 5},
        checkpoint={"everySteps": EVERY, "keep": 2},
    )
    jobs.apply_job(cluster, namespace, job)

    # 1. Past the first checkpoint, a worker pod goes.
    watch.until(
        cluster,
        lambda _: _checkpoint_step(watch.statuses[-1]) >= EVERY and _step(watch.statuses[-1]) > EVERY,
        what="the first checkpoint",
    )
    before = watch.statuses[-1]
    step_at_kill, checkpoint_at_kill = _step(before), _checkpoint_step(before)
    loss_at_kill = float(_progress(before)["loss"])
    originals = {p["metadata"]["name"] for p in watch.pods_of_type("worker")}
    victim = sorted(originals)[0]
    # As a node failure would: SIGTERM, then SIGKILL a second later.
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--grace-period=1", "--wait=false")
    killed = time.monotonic()
    watch.mark(f"deleted {victim}")

    def resumed_and_checkpointed(_: str) -> bool:
        """A new worker pod ran, the trainer resumed, and it checkpointed again after resuming (a
        checkpoint saved during the kill's grace second does not count)."""
        if not {p["metadata"]["name"] for p in watch.pods_of_type("worker")} - originals:
            return False
        resumes = _resumed_steps(cluster, namespace)
        return bool(resumes) and _checkpoint_step(watch.statuses[-1]) > resumes[0]

    # KubeRay runs a new worker pod, Ray Train restarts the group, training checkpoints again.
    watch.until(
        cluster, resumed_and_checkpointed, what="a new worker pod, a resume and a checkpoint after it"
    )
    resumed_after_kill = time.monotonic()
    resumes = _resumed_steps(cluster, namespace)
    assert len(resumes) == 1, (resumes, watch.story(cluster))
    (resumed,) = resumes
    # No checkpoint was lost: at most the steps since the last one (< one interval) are redone.
    assert checkpoint_at_kill <= resumed <= checkpoint_at_kill + EVERY, (
        resumed,
        checkpoint_at_kill,
        step_at_kill,
    )
    # The loss carried on from where it was, far below an untrained model's (ln 384 = 5.95).
    after = [
        float(_progress(s)["loss"])
        for s in watch.statuses[watch.statuses.index(before) + 1 :]
        if _progress(s).get("loss") is not None and _step(s) > resumed
    ]
    assert after and after[0] < min(loss_at_kill * 1.5, 5.0), (loss_at_kill, after[:5])

    # 2. Suspend: every Ray pod goes, the checkpoints stay; resume continues from the last one.
    watch.mark("suspend")
    cluster.kubectl("patch", "llmtj", NAME, "-n", namespace, "--type=merge", "-p", _suspend(True))
    watch.until(
        cluster, lambda phase: phase == "Suspended" and not jobs.ray_pods(cluster, namespace), what="suspend"
    )
    suspended_at = _checkpoint_step(watch.statuses[-1])
    assert checkpoint_at_kill < suspended_at < STEPS, watch.statuses[-1]  # it stopped mid-run
    watch.mark("resume")
    cluster.kubectl("patch", "llmtj", NAME, "-n", namespace, "--type=merge", "-p", _suspend(False))
    phase = watch.until(cluster, lambda phase: phase in jobs.TERMINAL)
    assert phase == "Succeeded", watch.story(cluster)
    first = get(cluster, "llmtj", NAME, namespace)
    result = jobs.read_result(cluster, namespace, jobs.run_dir(namespace, NAME, first["metadata"]["uid"]))
    assert result["resumed_from_step"] == suspended_at, (result, suspended_at)
    assert result["finished"] and result["steps"] == STEPS, result
    finished = time.monotonic()
    watch.mark("result read")

    # 3. Delete and apply again under the same name, with another spec: the README's Hugging Face
    # Trainer example (issue #21 scenario 6 runs here, saving a Ray cluster start). A new run from
    # step 0 in a new run folder, with the new config. Applied again at once, while the earlier
    # job's Ray pods are still going: the new job waits for them (the kubelet would hand a new pod
    # the earlier job's immutable config of the same name from its cache, and the HF job would
    # train as the builtin one) and then starts a run of its own.
    cluster.kubectl("delete", "llmtj", NAME, "-n", namespace, "--wait=true", timeout=120)
    earlier_pods = jobs.ray_pods(cluster, namespace)
    hf_job = jobs.mode_job("tiny-cpu-hf.yaml", NAME, SHAPE)
    jobs.apply_job(cluster, namespace, hf_job)
    again = jobs.Watch(namespace, NAME, t0=started)
    again.mark("deleted and applied again")
    phase = again.until(cluster, lambda phase: phase in jobs.TERMINAL, what="the re-created job to finish")
    assert phase == "Succeeded", again.story(cluster)
    second = get(cluster, "llmtj", NAME, namespace)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    # Not the old run's end: it stepped from the start, as the HF mode, in a run of its own.
    assert _step(again.statuses[0]) < STEPS and _step(again.statuses[-1]) == jobs.MODE_STEPS, [
        (s.get("phase"), s.get("progress"), s.get("startTime")) for s in again.statuses
    ]
    recreated = jobs.check_mode_run(cluster, namespace, again, hf_job)
    assert recreated["resumed_from_step"] is None and recreated["resume_from"] is None, recreated
    assert _resumed_steps(cluster, namespace) == [], "the re-created job resumed the old run"
    waited = [s["message"] for s in again.statuses if "earlier LLMTrainingJob" in s.get("message", "")]
    assert waited or not earlier_pods, ("the new job did not wait for the earlier pods", earlier_pods)
    print("\n" + watch.timings() + "\n" + again.timings())
    print(
        f"\nkill at {step_at_kill} (checkpoint {checkpoint_at_kill}) -> resumed {resumed} in "
        f"{resumed_after_kill - killed:.0f} s; suspended at {suspended_at}, finished "
        f"{finished - resumed_after_kill:.0f} s later; re-created as the HF mode, finished after "
        f"{time.monotonic() - finished:.0f} s ({len(earlier_pods)} earlier pods waited for); "
        f"scenario {time.monotonic() - started:.0f} s"
    )


def _suspend(value: bool) -> str:
    return json.dumps({"spec": {"runPolicy": {"suspend": value}}})
