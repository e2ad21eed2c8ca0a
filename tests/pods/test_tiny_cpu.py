"""The README's first cluster example in real pods (issue #21, scenario 2).

Exactly as a user does it: `llmtrain upload examples/data --claim llmtrain-data --size 1Gi --to
data`, then `kubectl apply -f examples/tiny-cpu.yaml` unchanged. Only real pods show that KubeRay's
head and worker pods start from the trainer image under restricted Pod Security, that the workers
find the head through the Service's DNS name, that KubeRay's submitter (`ray job submit`) runs the
entrypoint, that the trainer reports progress from inside its pod with the per-job token, and that
the export on the shared volume loads for another user of the same fsGroup.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from llmtrain.render.names import trainer_account_name

from tests.pods.conftest import RESTRICTED, Release, get, on_real_node
from tests.support.cluster import audit, node
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.steps import table

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "tiny-cpu.yaml"
LLMTRAIN = Path(sys.executable).with_name("llmtrain")
JOB_TIMEOUT = 900


@dataclass
class Watch:
    """What was seen while the job ran: `kubectl get llmtj` rows and the pods' placements."""

    rows: list[dict[str, str]] = field(default_factory=list)
    running_pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> pod, once Running
    submitter_succeeded: bool = False

    def look(self, cluster: Cluster, namespace: str, name: str) -> str:
        out = cluster.kubectl("get", "llmtj", name, "-n", namespace, check=False).stdout
        rows = table(out)
        if rows and (not self.rows or rows[0] != self.rows[-1]):
            self.rows.append(rows[0])
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        for pod in pods:
            if pod["status"].get("phase") == "Running":
                self.running_pods.setdefault(pod["metadata"]["name"], pod)
        jobs = json.loads(cluster.kubectl("get", "jobs", "-n", namespace, "-o", "json").stdout)["items"]
        self.submitter_succeeded |= any((j.get("status") or {}).get("succeeded") for j in jobs)
        return rows[0]["PHASE"] if rows else ""

    def progress(self) -> list[tuple[int, float]]:
        """(step, loss) of each distinct row that shows both, in the order seen."""
        out = []
        for row in self.rows:
            if row.get("PROGRESS") and row.get("LOSS"):
                out.append((int(row["PROGRESS"].split("/")[0]), float(row["LOSS"])))
        return out


def _llmtrain(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(LLMTRAIN), *args, "--kubeconfig", str(cluster.kubeconfig)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout}\n{result.stderr}"
    return result


def _diagnose(cluster: Cluster, namespace: str) -> str:
    """The job's status and the head's log, for a failure message."""
    parts = [cluster.kubectl("get", "llmtj,rayjob,pods", "-n", namespace, "-o", "wide", check=False).stdout]
    status = cluster.kubectl("get", "llmtj", "-n", namespace, "-o=jsonpath={.items[0].status}", check=False)
    parts.append(status.stdout)
    for selector in ("ray.io/node-type=head", "batch.kubernetes.io/job-name"):
        logs = cluster.kubectl("logs", "-n", namespace, "-l", selector, "--tail=60", check=False)
        parts.append(logs.stdout + logs.stderr)
    return "\n".join(parts)[-8000:]


def _loader_pod(namespace: str, image: str, run_dir: str) -> dict[str, Any]:
    """The trainer image as another user (UID/GID 2001) of the Ray pods' fsGroup: it lists the
    run's checkpoints and loads the export with transformers and generates from it."""
    script = f"""
import json, pathlib, torch
from transformers import AutoModelForCausalLM
run = pathlib.Path({run_dir!r})
model = AutoModelForCausalLM.from_pretrained(run / "export")
out = model.generate(torch.tensor([[72, 101, 108]]), max_new_tokens=8, do_sample=False)
print(json.dumps({{
    "checkpoints": sorted(p.name for p in run.glob("checkpoint-step-*")),
    "export": sorted(p.name for p in (run / "export").iterdir()),
    "generated": out.shape[-1],
}}))
"""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "loader", "namespace": namespace},
        "spec": on_real_node(
            {
                "restartPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 2001,
                    "runAsGroup": 2001,
                    "fsGroup": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", script],
                        "env": [{"name": "HF_HOME", "value": "/tmp/hf"}, {"name": "HOME", "value": "/tmp"}],
                        # Burstable: it fits beside a finished job's Ray pods until KubeRay
                        # deletes them (the job's ttlSecondsAfterFinished).
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "512Mi"},
                            "limits": {"cpu": "1", "memory": "2Gi"},
                        },
                        "securityContext": RESTRICTED,
                        "volumeMounts": [{"name": "storage", "mountPath": "/mnt/llmtrain", "readOnly": True}],
                    }
                ],
                "volumes": [{"name": "storage", "persistentVolumeClaim": {"claimName": "llmtrain-data"}}],
            }
        ),
    }


def test_readme_example_trains_in_real_pods_reports_progress_and_exports_a_loadable_model(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    started = time.monotonic()
    example = yaml.safe_load(EXAMPLE.read_text())
    name = example["metadata"]["name"]
    claim = example["spec"]["storage"]["claimName"]
    mark = audit.size(cluster.audit_log)

    # The README's two commands, the example file unchanged.
    _llmtrain(
        cluster,
        "upload",
        "examples/data",
        "--claim",
        claim,
        "--size",
        "1Gi",
        "--to",
        "data",
        "-n",
        namespace,
        "--image",
        release.trainer_image,
    )
    uploaded = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))

    watch = Watch()
    phase = ""
    deadline = time.monotonic() + JOB_TIMEOUT
    while phase not in ("Succeeded", "Failed") and time.monotonic() < deadline:
        phase = watch.look(cluster, namespace, name)
        time.sleep(2)
    trained = time.monotonic()
    took = trained - uploaded
    assert phase == "Succeeded", f"phase {phase!r} after {took:.0f} s\n{_diagnose(cluster, namespace)}"

    # KubeRay's head and both workers really ran on the real node, the workers pointed at the
    # head Service's cluster DNS name (training with 2 workers needed them to join it).
    pods = watch.running_pods.values()
    by_type: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_type.setdefault(pod["metadata"].get("labels", {}).get("ray.io/node-type", ""), []).append(pod)
    assert len(by_type.get("head", [])) == 1 and len(by_type.get("worker", [])) == 2, sorted(
        p["metadata"]["name"] for p in pods
    )
    for pod in [*by_type["head"], *by_type["worker"]]:
        assert pod["spec"]["nodeName"] == node.NODE_NAME, (pod["metadata"]["name"], pod["spec"]["nodeName"])
    for worker in by_type["worker"]:
        (ray,) = [c for c in worker["spec"]["containers"] if c["name"] == "ray-worker"]
        env = {e["name"]: e.get("value", "") for e in ray.get("env", [])}
        assert env.get("FQ_RAY_IP", "").endswith(f".{namespace}.svc.cluster.local"), env.get("FQ_RAY_IP")
    # KubeRay's submitter Job ran `ray job submit` to completion.
    assert watch.submitter_succeeded

    # `kubectl get llmtj` showed the step advancing with a loss while it trained.
    progress = watch.progress()
    steps = [s for s, _ in progress]
    assert len(set(steps)) >= 3 and steps == sorted(steps), watch.rows
    assert progress[-1][1] < progress[0][1], progress
    # ... written from inside the pod with the job's own token, not the operator's.
    account = f"system:serviceaccount:{namespace}:{trainer_account_name(name)}"
    calls = audit.calls(cluster.audit_log, account, since=mark)
    writes = [c for c in calls if c.resource == "llmtrainingjobs/status"]
    assert any(c.verb == "patch" and c.code == 200 for c in writes), writes

    # Checkpoints and the export on the volume; another UID of the fsGroup loads and generates.
    job = get(cluster, "llmtj", name, namespace)
    run_dir = f"/mnt/llmtrain/runs/{namespace}/{name}/{job['metadata']['uid']}"
    cluster.apply([_loader_pod(namespace, release.trainer_image, run_dir)])
    deadline = time.monotonic() + 300
    while get(cluster, "pod", "loader", namespace)["status"].get("phase") not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, "the loader pod did not finish"
        time.sleep(2)
    logs = cluster.kubectl("logs", "loader", "-n", namespace).stdout
    assert get(cluster, "pod", "loader", namespace)["status"]["phase"] == "Succeeded", logs[-3000:]
    loaded = json.loads(logs.strip().splitlines()[-1])
    assert len(loaded["checkpoints"]) == example["spec"]["checkpoint"]["keep"], loaded
    assert "config.json" in loaded["export"] and loaded["generated"] == 3 + 8, loaded
    print(
        f"\nupload {uploaded - started:.0f} s, apply to Succeeded {trained - uploaded:.0f} s, "
        f"load {time.monotonic() - trained:.0f} s; {len(watch.rows)} distinct rows, progress {progress}"
    )
