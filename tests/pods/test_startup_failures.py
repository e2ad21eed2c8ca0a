"""Jobs that cannot start, with a real kubelet (issue #21, scenario 5), and the custom-function
mode's short run (scenario 6; the Hugging Face Trainer mode runs in test_lifecycle.py, as the job
re-created under the builtin job's name), side by side on the real node: the failing jobs' pods
never run a process, so they cost the custom job no CPU, and the tier saves a scenario's minute.

One job names an image that does not exist and one a Secret that does not exist. Each fails at
`runPolicy.startupDeadlineSeconds` with a message naming the image or the Secret, read from the
kubelet's own waiting reasons (ErrImagePull/ImagePullBackOff, CreateContainerConfigError), and
leaves no Ray pod holding the node. The cluster tier covers the same decisions with kwok writing
those reasons.

The custom mode imports the user's module from the shared volume (`trainer.custom.path`, uploaded
there as the example's comment says), a path only a real container exercises.
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
# The failing jobs' Ray pods (a head and a worker each; their submitters never start) never run a
# process, so they request next to no CPU: at 100m each they and the custom job (500m head, 500m
# worker, 200m submitter) beside the operator (100m) and an upload pod still going (100m) did not
# fit the 2-core node, and the failing job's workers were left unschedulable instead of failing on
# the image. A worker asks 200m all the same (KubeRay's wait-gcs-ready init container): one worker
# each, 2 x (10m + 200m), leaves the custom job's head 700m (the head's CPU is most of a Ray cluster's
# start-up here).
SMALL = {
    "workers": 1,
    "cpu": "10m",
    "memory": "1Gi",
    "sharedMemory": "256Mi",
    "head": {"cpu": "10m", "memory": "1Gi"},
}
CUSTOM = "custom"
CUSTOM_SHAPE = {**jobs.MODE_SHAPE, "head": {"cpu": "700m", "memory": "3Gi"}}


def test_jobs_that_cannot_start_fail_at_their_deadline_while_the_custom_mode_trains_beside_them(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    started = time.monotonic()
    jobs.seed_data(cluster, release, namespace)
    # The custom example's module goes where its `trainer.custom.path` points on the volume.
    jobs.seed_data(cluster, release, namespace, source="examples/custom", to="custom")
    uploaded = time.monotonic()
    custom = jobs.mode_job("tiny-cpu-custom.yaml", CUSTOM, CUSTOM_SHAPE)
    policy = {"startupDeadlineSeconds": DEADLINE, "maxRetries": 1}
    no_image = jobs.variant("no-image", resources={**SMALL, "image": MISSING_IMAGE}, runPolicy=policy)
    secret_env = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": MISSING_SECRET, "key": "token"}}}
    no_secret = jobs.variant("no-secret", resources=SMALL, network={"env": [secret_env]}, runPolicy=policy)
    for job in (custom, no_image, no_secret):
        jobs.apply_job(cluster, namespace, job)

    expected = {"no-image": MISSING_IMAGE, "no-secret": MISSING_SECRET}
    watches = {name: jobs.Watch(namespace, name) for name in (*expected, CUSTOM)}
    phases = dict.fromkeys(watches, "")
    ended_at: dict[str, float] = {}  # seconds after the upload
    gone_at: dict[str, float] = {}  # a failing job's Ray pods all gone, seconds after the upload
    deadline = time.monotonic() + jobs.JOB_TIMEOUT
    # All watched side by side, until each ended and the failing jobs' Ray pods are gone.
    while not (all(p in jobs.TERMINAL for p in phases.values()) and gone_at.keys() == expected.keys()):
        assert time.monotonic() < deadline, "\n".join(w.story(cluster) for w in watches.values())
        seen = jobs.Snapshot.take(cluster, namespace)
        phases = {name: watch.look(cluster, seen) for name, watch in watches.items()}
        for name, phase in phases.items():
            if phase in jobs.TERMINAL:
                ended_at.setdefault(name, time.monotonic() - uploaded)
            if name in expected and name in ended_at and not seen.ray_pods(name):
                gone_at.setdefault(name, time.monotonic() - uploaded)
        now = time.monotonic() - uploaded
        # Each failing job ends at its deadline (not only when the custom job does), and its Ray
        # pods go soon after: nothing is left holding the node.
        late = [n for n in expected if n not in ended_at and now > DEADLINE + 300]
        late += [n for n in expected if n in ended_at and n not in gone_at and now - ended_at[n] > 120]
        assert not late, "\n".join(watches[n].story(cluster) for n in late)
        time.sleep(2)

    ended: dict[str, dict[str, Any]] = {}
    for name, watch in ((n, watches[n]) for n in expected):
        assert phases[name] == "Failed", watch.story(cluster)
        ended[name] = watch.statuses[-1]
        message = str(ended[name].get("message") or "")
        assert expected[name] in message, (name, message)
        # It waited, saying why, before it failed: the cause was in the status while Initializing.
        waiting = [s for s in watch.statuses if s.get("phase") != "Failed"]
        assert any(expected[name] in str(s.get("message") or "") for s in waiting), [
            s.get("message") for s in watch.statuses
        ]
    assert phases[CUSTOM] == "Succeeded", watches[CUSTOM].story(cluster)
    jobs.check_mode_run(cluster, namespace, watches[CUSTOM], custom)
    print(
        "\n"
        + "; ".join(f"{name}: {ended[name].get('message')}" for name in expected)
        + f"; upload {uploaded - started:.0f} s, ended after "
        + ", ".join(f"{name} {t:.0f} s" for name, t in sorted(ended_at.items(), key=lambda kv: kv[1]))
    )
