"""Steps the real-pod scenarios share: seed the data as the README says, apply a job, watch what
`kubectl get llmtj` and the pods show until it ends, and read the run's files back from the volume
(from the claim's folder on the node's host)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from llmtrain.constants import JOB_UID_LABEL

from tests.pods.conftest import Release, get
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.node import NODE_NAME, REAL_NODE_LABEL
from tests.support.cluster.steps import table

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
LLMTRAIN = Path(sys.executable).with_name("llmtrain")
MOUNT = "/mnt/llmtrain"
JOB_TIMEOUT = 900
TERMINAL = ("Succeeded", "Failed")


def example(path: Path = EXAMPLE) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def variant(name: str, base: Path = EXAMPLE, **overrides: dict[str, Any]) -> dict[str, Any]:
    """The example under another name, with some spec sections merged over (one level deep).

    Its pods are pinned to the real node: on a full real node the scheduler would otherwise put
    them on kwok's CPU node (its taint only discourages), where kwok fakes what the scenario
    tests (a pulled image, a Secret resolved, a process that trains)."""
    job = copy.deepcopy(example(base))
    job["metadata"]["name"] = name
    for section, values in overrides.items():
        job["spec"][section] = {**job["spec"].get(section, {}), **values}
    job["spec"]["resources"].setdefault("nodeSelector", {REAL_NODE_LABEL: "true"})
    return job


# One worker at the README example's pod shape, for the other trainer modes' short runs: Ray pods
# below 500m CPU fail their own start-up timeouts here (a first try at 200-250m restarted every Ray
# container three times), and two jobs at 500m do not fit the 2-core node together.
MODE_SHAPE = {
    "workers": 1,
    "cpu": "500m",
    "memory": "2Gi",
    "sharedMemory": "512Mi",
    "head": {"cpu": "500m", "memory": "3Gi"},
}
# The same with the head at a whole core, for a job that has the node to itself: the head (GCS,
# the dashboard, the driver, Ray Train's controller; its limit is its request) at 500m took 75-110 s
# of each Ray cluster start, from the submitter's start to the first step, under load. Head 1000m,
# worker 500m (KubeRay's wait-gcs-ready init container asks 200m), the submitter 200m and the
# operator 100m make 1.8 of the node's 2 cores.
WHOLE_HEAD_SHAPE = {**MODE_SHAPE, "head": {"cpu": "1", "memory": "3Gi"}}
MODE_STEPS = 30


def mode_job(example_file: str, name: str, shape: dict[str, Any] = MODE_SHAPE) -> dict[str, Any]:
    """An example of another trainer mode, short and small (at `shape`), on the claim the data was
    uploaded to (not a created one)."""
    job = variant(
        name,
        base=REPO_ROOT / "examples" / example_file,
        resources=shape,
        training={"maxSteps": MODE_STEPS, "logEverySteps": 5},
        checkpoint={"everySteps": 10},
    )
    job["spec"]["storage"] = {"claimName": example()["spec"]["storage"]["claimName"]}
    return job


def llmtrain(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(LLMTRAIN), *args, "--kubeconfig", str(cluster.kubeconfig)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout}\n{result.stderr}"
    return result


def seed_data(
    cluster: Cluster, release: Release, namespace: str, source: str = "examples/data", to: str = "data"
) -> None:
    """The README's `llmtrain upload examples/data --claim llmtrain-data --size 1Gi --to data`."""
    claim = example()["spec"]["storage"]["claimName"]
    llmtrain(
        cluster,
        "upload",
        source,
        "--claim",
        claim,
        "--size",
        "1Gi",
        "--to",
        to,
        "-n",
        namespace,
        "--image",
        release.trainer_image,
    )


def apply_job(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))


@dataclass(frozen=True)
class Snapshot:
    """One look at a namespace: its `kubectl get llmtj` rows, its LLMTrainingJobs, pods and
    (submitter) Jobs, in two kubectl calls. Each call costs about 0.1 s of CPU on a node that
    has two cores for the Ray pods too; several jobs watched side by side share one snapshot."""

    rows: dict[str, dict[str, str]]  # by job name
    llmtjs: dict[str, dict[str, Any]]  # by name
    pods: list[dict[str, Any]]
    jobs: list[dict[str, Any]]

    @classmethod
    def take(cls, cluster: Cluster, namespace: str) -> Snapshot:
        rows = table(cluster.kubectl("get", "llmtj", "-n", namespace, check=False).stdout)
        listed = cluster.kubectl("get", "llmtj,pods,jobs", "-n", namespace, "-o", "json").stdout
        items: list[dict[str, Any]] = json.loads(listed)["items"]
        of = {kind: [i for i in items if i["kind"] == kind] for kind in ("LLMTrainingJob", "Pod", "Job")}
        return cls(
            {row["NAME"]: row for row in rows},
            {i["metadata"]["name"]: i for i in of["LLMTrainingJob"]},
            of["Pod"],
            of["Job"],
        )

    def ray_pods(self, job: str) -> list[str]:
        """As `ray_pods`: the names (`pod/...`) of `job`'s Ray pods."""
        return [
            f"pod/{p['metadata']['name']}"
            for p in self.pods
            if "ray.io/node-type" in (p["metadata"].get("labels") or {})
            and p["metadata"]["name"].startswith(f"{job}-")
        ]


@dataclass
class Watch:
    """What was seen while a job ran: its `kubectl get llmtj` rows, its status, and its pods."""

    namespace: str
    name: str
    rows: list[dict[str, str]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    running_pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> pod, once Running
    submitter_succeeded: bool = False
    # (seconds since the first look, what changed): phase, step, checkpoint and Ray pods' phases.
    timeline: list[tuple[float, str]] = field(default_factory=list)
    t0: float = 0.0  # time.monotonic() of the timeline's zero; the first look's if unset

    def look(self, cluster: Cluster, seen: Snapshot | None = None) -> str:
        """One look (at `seen`, else a snapshot of its own); the phase. Pods and submitter Jobs
        count only when they are this job's (its uid on their pod template): an earlier job of the
        name may still have pods going."""
        seen = seen or Snapshot.take(cluster, self.namespace)
        row = seen.rows.get(self.name)
        if row and (not self.rows or row != self.rows[-1]):
            self.rows.append(row)
        job = seen.llmtjs.get(self.name)
        assert job is not None, f"no LLMTrainingJob {self.name} in {self.namespace}"
        uid = job["metadata"]["uid"]
        status = job.get("status") or {}
        if not self.statuses or status != self.statuses[-1]:
            self.statuses.append(status)
        for pod in seen.pods:
            if pod["status"].get("phase") == "Running" and _uid_of(pod["metadata"]) in (uid, None):
                self.running_pods.setdefault(pod["metadata"]["name"], pod)
        self.submitter_succeeded |= any(
            (j.get("status") or {}).get("succeeded") and _uid_of(j["spec"]["template"]["metadata"]) == uid
            for j in seen.jobs
        )
        phase = str(status.get("phase") or "")
        self._record(phase, status, seen.pods)
        return phase

    def _record(self, phase: str, status: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """A timeline entry when the phase, step, checkpoint or a Ray pod's phase changed (`-`: being
        deleted): where a scenario's time goes."""
        progress = status.get("progress") or {}
        ray = sorted(
            f"{p['metadata']['labels']['ray.io/node-type']}:{p['status'].get('phase')}"
            + ("-" if p["metadata"].get("deletionTimestamp") else "")
            for p in pods
            if "ray.io/node-type" in (p["metadata"].get("labels") or {})
        )
        checkpoint = (progress.get("lastCheckpoint") or {}).get("step")
        now = time.monotonic()
        self.t0 = self.t0 or now
        entry = f"{phase} step={progress.get('step')} ckpt={checkpoint} {' '.join(ray)}"
        if not self.timeline or self.timeline[-1][1] != entry:
            self.timeline.append((now - self.t0, entry))

    def mark(self, what: str) -> None:
        """A test's own event (a kill, a patch) in the timeline."""
        now = time.monotonic()
        self.t0 = self.t0 or now
        self.timeline.append((now - self.t0, f"-- {what}"))

    def timings(self) -> str:
        """The timeline, a line per entry."""
        return "\n".join(f"{t:7.1f} s  {entry}" for t, entry in self.timeline)

    def until(
        self,
        cluster: Cluster,
        done: Callable[[str], bool],
        *,
        timeout: float = JOB_TIMEOUT,
        what: str = "the job to finish",
    ) -> str:
        """Look every 2 s until `done(phase)`; the phase. Fails with the job's story otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            phase = self.look(cluster)
            if done(phase):
                return phase
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what} (phase {phase!r})\n{self.story(cluster)}")
            time.sleep(2)

    def progress(self) -> list[tuple[int, float]]:
        """(step, loss) of each distinct row that shows both, in the order seen."""
        return [
            (int(row["PROGRESS"].split("/")[0]), float(row["LOSS"]))
            for row in self.rows
            if row.get("PROGRESS") and row.get("LOSS")
        ]

    def pods_of_type(self, node_type: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.running_pods.values()
            if p["metadata"].get("labels", {}).get("ray.io/node-type") == node_type
        ]

    def story(self, cluster: Cluster) -> str:
        """The job, its RayJob and pods, its status and the Ray logs: for a failure message."""
        ns = self.namespace
        parts = [cluster.kubectl("get", "llmtj,rayjob,pods", "-n", ns, "-o", "wide", check=False).stdout]
        parts.append(json.dumps(self.statuses[-1] if self.statuses else {}))
        parts.append(self.timings()[-2000:])
        for selector in ("ray.io/node-type=head", "batch.kubernetes.io/job-name"):
            logs = cluster.kubectl("logs", "-n", ns, "-l", selector, "--tail=40", check=False)
            parts.append(logs.stdout + logs.stderr)
        return "\n".join(parts)[-8000:]


def _uid_of(metadata: dict[str, Any]) -> str | None:
    """The LLMTrainingJob uid a pod (or pod template) carries; None on pods that are no job's
    (the upload and reader pods)."""
    uid = (metadata.get("labels") or {}).get(JOB_UID_LABEL)
    return str(uid) if uid else None


def ray_pods(cluster: Cluster, namespace: str, job: str | None = None) -> list[str]:
    """Names (`pod/...`) of the Ray pods KubeRay made in `namespace`, of `job` only if given."""
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", "ray.io/node-type", "-o", "name")
    return [name for name in out.stdout.split() if job is None or f"/{job}-" in name]


def wait_no_ray_pods(cluster: Cluster, namespace: str, job: str | None = None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while pods := ray_pods(cluster, namespace, job):
        assert time.monotonic() < deadline, pods
        time.sleep(2)


def run_dir(namespace: str, name: str, uid: str) -> str:
    return f"{MOUNT}/runs/{namespace}/{name}/{uid}"


def run_pod(cluster: Cluster, pod: dict[str, Any], timeout: float = 300) -> str:
    """Create a pod, wait for it to end, delete it; its log. Fails unless it Succeeded."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    cluster.apply([pod])
    deadline = time.monotonic() + timeout
    while (phase := get(cluster, "pod", name, namespace)["status"].get("phase")) not in TERMINAL:
        assert time.monotonic() < deadline, f"pod {name} did not finish ({phase})"
        time.sleep(2)
    logs = cluster.kubectl("logs", name, "-n", namespace).stdout
    cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
    assert phase == "Succeeded", logs[-3000:]
    return logs


def claim_folder(cluster: Cluster, namespace: str, claim: str) -> Path:
    """The host folder behind a bound claim: local-path's hostPath volume under the real node's
    `<cluster>/node/volumes` (the pods' mount shows the same folder)."""
    volume = get(cluster, "pvc", claim, namespace)["spec"]["volumeName"]
    folder = Path(get(cluster, "pv", volume)["spec"]["hostPath"]["path"])
    assert folder.is_relative_to(cluster.directory / "node" / "volumes"), folder
    return folder


def read_result(cluster: Cluster, namespace: str, directory: str) -> dict[str, Any]:
    """The run's result.json (`directory` as the pods mount it), read from the claim's folder on
    the node's host: what the trainer wrote is what matters here, and a reader pod cost a pod's
    start and end each time. That another user of the volume can read a run's files is
    test_tiny_cpu.py's loader pod's to show."""
    claim = example()["spec"]["storage"]["claimName"]
    relative = Path(directory).relative_to(MOUNT)
    result: dict[str, Any] = json.loads(
        (claim_folder(cluster, namespace, claim) / relative / "result.json").read_text()
    )
    return result


def check_mode_run(cluster: Cluster, namespace: str, watch: Watch, job: dict[str, Any]) -> dict[str, Any]:
    """What a `mode_job` that Succeeded must show; its run result.

    Its one worker ran in a real pod on the real node and the submitter ran the entrypoint;
    progress reached `kubectl get llmtj` from inside the pod; the run result on the volume names
    the job's own trainer mode (not another incarnation's) and reached the last step from step 0."""
    workers = watch.pods_of_type("worker")
    assert [p["spec"]["nodeName"] for p in workers] == [NODE_NAME], sorted(watch.running_pods)
    assert watch.submitter_succeeded
    steps = [step for step, _ in watch.progress()]
    assert steps and steps == sorted(steps) and 0 < steps[-1] <= MODE_STEPS, watch.rows
    uid = get(cluster, "llmtj", watch.name, namespace)["metadata"]["uid"]
    result = read_result(cluster, namespace, run_dir(namespace, watch.name, uid))
    assert result["trainer"] == job["spec"]["trainer"]["type"], result
    assert result["world_size"] == 1 and result["finished"] and result["steps"] == MODE_STEPS, result
    assert result["checkpoint"], result
    return result
