"""A job that cannot start, with a real kubelet (issue #21, scenario 5): an image that does not
exist and a Secret that does not exist. Each fails at `runPolicy.startupDeadlineSeconds` with a
message naming the image or the Secret, read from the kubelet's own waiting reasons
(ErrImagePull/ImagePullBackOff, CreateContainerConfigError), and leaves no Ray pod holding the
node. The cluster tier covers the same decisions with kwok writing those reasons.
"""

from __future__ import annotations

import time
from typing import Any

from tests.pods import jobs
from tests.pods.conftest import Release
from tests.support.cluster.cluster import Cluster

# The operator looks at a starting job 10 s after its start and every 15 s after: two looks see
# the kubelet's reason before the deadline.
DEADLINE = 30
MISSING_IMAGE = "localhost/llmtrain/no-such-trainer:1"
MISSING_SECRET = "no-such-token"
# Small enough that both jobs' pods (3 Ray pods and a 200m submitter each) fit the 2-core node
# beside the operator with room to spare: neither job ever trains.
SMALL = {"cpu": "100m", "memory": "1Gi", "sharedMemory": "256Mi", "head": {"cpu": "100m", "memory": "1Gi"}}


def test_a_missing_image_or_secret_is_named_and_the_job_fails_at_its_startup_deadline(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    started = time.monotonic()
    jobs.seed_data(cluster, release, namespace)
    policy = {"startupDeadlineSeconds": DEADLINE, "maxRetries": 1}
    no_image = jobs.variant("no-image", resources={**SMALL, "image": MISSING_IMAGE}, runPolicy=policy)
    secret_env = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": MISSING_SECRET, "key": "token"}}}
    no_secret = jobs.variant("no-secret", resources=SMALL, network={"env": [secret_env]}, runPolicy=policy)
    for job in (no_image, no_secret):
        jobs.apply_job(cluster, namespace, job)

    expected = {"no-image": MISSING_IMAGE, "no-secret": MISSING_SECRET}
    watches = {name: jobs.Watch(namespace, name) for name in expected}
    phases = {name: "" for name in expected}
    deadline = time.monotonic() + DEADLINE + 300
    while not all(phase in jobs.TERMINAL for phase in phases.values()):  # both watched side by side
        assert time.monotonic() < deadline, "\n".join(w.story(cluster) for w in watches.values())
        phases = {name: watch.look(cluster) for name, watch in watches.items()}
        time.sleep(2)
    ended: dict[str, dict[str, Any]] = {}
    for name, watch in watches.items():
        assert phases[name] == "Failed", watch.story(cluster)
        ended[name] = watch.statuses[-1]
        message = str(ended[name].get("message") or "")
        assert expected[name] in message, (name, message)
        # It waited, saying why, before it failed: the cause was in the status while Initializing.
        waiting = [s for s in watch.statuses if s.get("phase") != "Failed"]
        assert any(expected[name] in str(s.get("message") or "") for s in waiting), [
            s.get("message") for s in watch.statuses
        ]
    # Nothing is left holding the node: every Ray pod of both jobs goes.
    deadline = time.monotonic() + 120
    while any(jobs.ray_pods(cluster, namespace, name) for name in expected):
        assert time.monotonic() < deadline, {
            name: jobs.ray_pods(cluster, namespace, name) for name in expected
        }
        time.sleep(2)
    print(
        "\n"
        + "; ".join(f"{name}: {ended[name].get('message')}" for name in expected)
        + f"; scenario {time.monotonic() - started:.0f} s"
    )
