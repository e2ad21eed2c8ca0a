"""The custom-function mode in real pods (issue #21, scenario 6; the Hugging Face Trainer mode runs
in test_lifecycle.py, as the job re-created under the builtin job's name).

The custom mode imports the user's module from the shared volume (`trainer.custom.path`, uploaded
there as the example's comment says), a path only a real container exercises."""

from __future__ import annotations

import time

from tests.pods import jobs
from tests.pods.conftest import Release
from tests.support.cluster.cluster import Cluster

NAME = "custom"


def test_the_custom_mode_trains_in_real_pods(cluster: Cluster, release: Release, namespace: str) -> None:
    started = time.monotonic()
    jobs.seed_data(cluster, release, namespace)
    # The custom example's module goes where its `trainer.custom.path` points on the volume.
    jobs.seed_data(cluster, release, namespace, source="examples/custom", to="custom")
    uploaded = time.monotonic()
    job = jobs.mode_job("tiny-cpu-custom.yaml", NAME)
    jobs.apply_job(cluster, namespace, job)
    watch = jobs.Watch(namespace, NAME)
    phase = watch.until(cluster, lambda phase: phase in jobs.TERMINAL)
    assert phase == "Succeeded", watch.story(cluster)
    jobs.check_mode_run(cluster, namespace, watch, job)
    print(f"\nupload {uploaded - started:.0f} s, custom {time.monotonic() - uploaded:.0f} s")
