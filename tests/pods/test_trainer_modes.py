"""The Hugging Face Trainer mode and the custom-function mode in real pods (issue #21, scenario 6).

The README's builtin example is scenario 2; these two modes reach the pods by other paths that
only a real container exercises: the HF mode imports transformers' Trainer and builds its
TrainingArguments inside the image, and the custom mode imports the user's module from the shared
volume (`trainer.custom.path`, uploaded there as the example's comment says). Both examples run
side by side, each on 2 workers, made small enough to share the 2-core node and pinned to it.
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
# Head 200m, workers 250m, submitter 200m: 0.9 CPU a job, both beside the operator on 2 cores.
SMALL = {
    "workers": 2,
    "cpu": "250m",
    "memory": "2Gi",
    "sharedMemory": "256Mi",
    "head": {"cpu": "200m", "memory": "3Gi"},
}


def _job(example: str, name: str) -> dict[str, Any]:
    """The example, short and small, on the claim the data was uploaded to (not a created one)."""
    job = jobs.variant(
        name,
        base=EXAMPLES / example,
        resources=SMALL,
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
    for job in modes.values():
        jobs.apply_job(cluster, namespace, job)

    watches = {name: jobs.Watch(namespace, name) for name in modes}
    phases = {name: "" for name in modes}
    deadline = time.monotonic() + jobs.JOB_TIMEOUT
    while not all(phase in jobs.TERMINAL for phase in phases.values()):  # both watched side by side
        assert time.monotonic() < deadline, "\n".join(w.story(cluster) for w in watches.values())
        phases = {name: watch.look(cluster) for name, watch in watches.items()}
        time.sleep(2)
    trained = time.monotonic()

    for name, watch in watches.items():
        assert phases[name] == "Succeeded", watch.story(cluster)
        # Both workers ran in real pods on the real node, and the submitter ran the entrypoint.
        workers = watch.pods_of_type("worker")
        assert len(workers) == 2, sorted(watch.running_pods)
        assert {p["spec"]["nodeName"] for p in workers} == {node.NODE_NAME}
        assert watch.submitter_succeeded
        # Progress reached `kubectl get llmtj` from inside the pods while the mode trained.
        steps = [step for step, _ in watch.progress()]
        assert steps and steps == sorted(steps) and 0 < steps[-1] <= STEPS, watch.rows
        # The mode's own run result on the volume: the right trainer, both ranks, to the end.
        uid = get(cluster, "llmtj", name, namespace)["metadata"]["uid"]
        result = jobs.read_result(cluster, namespace, jobs.run_dir(namespace, name, uid))
        expected_trainer = modes[name]["spec"]["trainer"]["type"]
        assert result["trainer"] == expected_trainer, result
        assert result["world_size"] == 2 and result["finished"] and result["steps"] == STEPS, result
        assert result["checkpoint"], result
    print(
        f"\nupload {uploaded - started:.0f} s, both modes to Succeeded {trained - uploaded:.0f} s, "
        f"progress {[w.progress()[-1] for w in watches.values()]}"
    )
