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
import time
from typing import Any

from llmtrain.render.names import trainer_account_name

from tests.pods import jobs
from tests.pods.conftest import RESTRICTED, Release, get, on_real_node
from tests.support.cluster import audit, node
from tests.support.cluster.cluster import Cluster


def _loader_pod(namespace: str, image: str, directory: str) -> dict[str, Any]:
    """The trainer image as another user (UID/GID 2001) of the Ray pods' fsGroup: it lists the
    run's checkpoints and loads the export with transformers and generates from it."""
    claim = jobs.example()["spec"]["storage"]["claimName"]
    script = f"""
import json, pathlib, torch
from transformers import AutoModelForCausalLM
run = pathlib.Path({directory!r})
model = AutoModelForCausalLM.from_pretrained(run / "export")
out = model.generate(torch.tensor([[72, 101, 108]]), max_new_tokens=8, do_sample=False)
print(json.dumps({{
    "checkpoints": sorted(p.name for p in run.glob("checkpoint-step-*")),
    "export": sorted(p.name for p in (run / "export").iterdir()),
    "generated": out.shape[-1],
    "result": json.loads((run / "result.json").read_text()),
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
                        "volumeMounts": [{"name": "storage", "mountPath": jobs.MOUNT, "readOnly": True}],
                    }
                ],
                "volumes": [
                    {
                        "name": "storage",
                        "persistentVolumeClaim": {"claimName": claim},
                    }
                ],
            }
        ),
    }


def test_readme_example_trains_in_real_pods_reports_progress_and_exports_a_loadable_model(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    started = time.monotonic()
    example = jobs.example()
    name = example["metadata"]["name"]
    mark = audit.size(cluster.audit_log)

    # The README's two commands, the example file unchanged.
    jobs.seed_data(cluster, release, namespace)
    uploaded = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", str(jobs.EXAMPLE))
    watch = jobs.Watch(namespace, name)
    phase = watch.until(cluster, lambda phase: phase in jobs.TERMINAL)
    trained = time.monotonic()
    assert phase == "Succeeded", f"{phase} after {trained - uploaded:.0f} s\n{watch.story(cluster)}"

    # KubeRay's head and both workers really ran on the real node, the workers pointed at the
    # head Service's cluster DNS name (training with 2 workers needed them to join it).
    heads, workers = watch.pods_of_type("head"), watch.pods_of_type("worker")
    assert len(heads) == 1 and len(workers) == 2, sorted(watch.running_pods)
    for pod in [*heads, *workers]:
        assert pod["spec"]["nodeName"] == node.NODE_NAME, (pod["metadata"]["name"], pod["spec"]["nodeName"])
    for worker in workers:
        (ray,) = [c for c in worker["spec"]["containers"] if c["name"] == "ray-worker"]
        env = {e["name"]: e.get("value", "") for e in ray.get("env", [])}
        assert env.get("FQ_RAY_IP", "").endswith(f".{namespace}.svc.cluster.local"), env.get("FQ_RAY_IP")
    # KubeRay's submitter Job ran `ray job submit` to completion.
    assert watch.submitter_succeeded
    # `llmtrain logs` reads them as a user would: the submitter's log (the default) is the
    # driver's, with the trainer's step lines forwarded from the workers; the head and a worker
    # answer too (their containers run `ray start`).
    steps = example["spec"]["training"]["maxSteps"]
    logs = jobs.llmtrain(cluster, "logs", name, "-n", namespace, "--follow")
    assert f"step {steps}/{steps}" in logs.stdout and "(submitter)" in logs.stderr, logs.stdout[-3000:]
    for which in (["--head"], ["--worker", "1"]):
        shown = jobs.llmtrain(cluster, "logs", name, "-n", namespace, "--tail", "5", *which)
        assert f"({'head' if which == ['--head'] else 'worker'})" in shown.stderr, shown.stderr

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

    # Checkpoints and the export on the volume; another UID of the fsGroup loads and generates,
    # and the run used one training process on each worker pod.
    uid = get(cluster, "llmtj", name, namespace)["metadata"]["uid"]
    directory = jobs.run_dir(namespace, name, uid)
    logs = jobs.run_pod(cluster, _loader_pod(namespace, release.trainer_image, directory))
    loaded = json.loads(logs.strip().splitlines()[-1])
    assert len(loaded["checkpoints"]) == example["spec"]["checkpoint"]["keep"], loaded
    assert "config.json" in loaded["export"] and loaded["generated"] == 3 + 8, loaded
    assert loaded["result"]["world_size"] == 2 and loaded["result"]["finished"], loaded
    hosts = {
        line.split("ip=")[1].split(")")[0] for line in watch.story(cluster).splitlines() if "ip=" in line
    }
    assert hosts, "no worker log lines"

    print(
        f"\nupload {uploaded - started:.0f} s, apply to Succeeded {trained - uploaded:.0f} s, "
        f"load {time.monotonic() - trained:.0f} s; {len(watch.rows)} distinct rows, progress {progress}"
    )

    # The logs the trainer saved in its run directory outlive the Ray pods (gone the job's
    # ttlSecondsAfterFinished after the end, 300 s, not waited for here): `llmtrain logs --saved`
    # reads them from the volume through a short-lived read-only pod of its own (then deleted).
    reader = ["-n", namespace, "--saved", "--image", release.trainer_image]
    saved = jobs.llmtrain(cluster, "logs", name, *reader, "--worker", "0")
    max_steps = example["spec"]["training"]["maxSteps"]
    assert f"step {max_steps}/{max_steps}" in saved.stdout, saved.stdout[-3000:] + saved.stderr
    assert "===== worker rank 0 attempt started" in saved.stdout, saved.stdout[:2000]
    assert f"{directory}/logs/worker-0.log" in saved.stderr and "driver.log" in saved.stderr, saved.stderr
    driver = jobs.llmtrain(cluster, "logs", name, *reader)
    assert f"run {uid}" in driver.stdout and "finished; export in" in driver.stdout, driver.stdout[-3000:]
