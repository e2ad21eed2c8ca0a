"""The Hugging Face Trainer mode and the custom-function mode in real pods (issue #21, scenario 6).

The README's builtin example is scenario 2; these two modes reach the pods by other paths that
only a real container exercises: the HF mode imports transformers' Trainer and builds its
TrainingArguments inside the image, and the custom mode imports the user's module from the shared
volume (`trainer.custom.path`, uploaded there as the example's comment says). One after the other,
each with one worker at the README example's pod shape: Ray pods below 500m CPU fail their own
start-up timeouts here (a first try at 200-250m, both jobs side by side, restarted every Ray
container three times), and two jobs at 500m do not fit the 2-core node together.
"""

from __future__ import annotations

import time
from typing import Any

from tests.pods import jobs
from tests.pods.conftest import Release, get
from tests.support.cluster import node
from tests.support.cluster.cluster import Cluster

EXAMPLES = jobs.REPO_ROOT / "examples"
STEPS = 30
SHAPE = {
    "workers": 1,
    "cpu": "500m",
    "memory": "2Gi",
    "sharedMemory": "512Mi",
    "head": {"cpu": "500m", "memory": "3Gi"},
}


def _job(example: str, name: str) -> dict[str, Any]:
    """The example, short and small, on the claim the data was uploaded to (not a created one)."""
    job = jobs.variant(
        name,
        base=EXAMPLES / example,
        resources=SHAPE,
        training={"maxSteps": STEPS, "logEverySteps": 5},
        checkpoint={"everySteps": 10},
    )
    job["spec"]["storage"] = {"claimName": jobs.example()["spec"]["storage"]["claimName"]}
    return job


def test_the_huggingface_and_custom_modes_train_in_real_pods(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    started = time.monotonic()
    jobs.seed_data(cluster, release, namespace)
    # The custom example's module goes where its `trainer.custom.path` points on the volume.
    jobs.seed_data(cluster, release, namespace, source="examples/custom", to="custom")
    uploaded = time.monotonic()
    modes = {"hf": _job("tiny-cpu-hf.yaml", "hf"), "custom": _job("tiny-cpu-custom.yaml", "custom")}
    took: dict[str, float] = {}
    for name, job in modes.items():
        began = time.monotonic()
        jobs.apply_job(cluster, namespace, job)
        watch = jobs.Watch(namespace, name)
        phase = watch.until(cluster, lambda phase: phase in jobs.TERMINAL)
        took[name] = time.monotonic() - began
        assert phase == "Succeeded", watch.story(cluster)
        # The worker ran in a real pod on the real node, and the submitter ran the entrypoint.
        workers = watch.pods_of_type("worker")
        assert [p["spec"]["nodeName"] for p in workers] == [node.NODE_NAME], sorted(watch.running_pods)
        assert watch.submitter_succeeded
        # Progress reached `kubectl get llmtj` from inside the pod while the mode trained.
        steps = [step for step, _ in watch.progress()]
        assert steps and steps == sorted(steps) and 0 < steps[-1] <= STEPS, watch.rows
        # The mode's own run result on the volume: the right trainer, to the last step.
        uid = get(cluster, "llmtj", name, namespace)["metadata"]["uid"]
        result = jobs.read_result(cluster, namespace, jobs.run_dir(namespace, name, uid))
        assert result["trainer"] == job["spec"]["trainer"]["type"], result
        assert result["world_size"] == 1 and result["finished"] and result["steps"] == STEPS, result
        assert result["checkpoint"], result
        # Its Ray pods go before the next job starts (they would not fit beside it).
        cluster.kubectl("delete", "llmtj", name, "-n", namespace, "--timeout=120s", timeout=150)
        jobs.wait_no_ray_pods(cluster, namespace, name)
    print(f"\nupload {uploaded - started:.0f} s, " + ", ".join(f"{n} {t:.0f} s" for n, t in took.items()))
