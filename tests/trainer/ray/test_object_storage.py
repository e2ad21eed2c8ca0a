"""`llmtrain run` with its data in, and its model out to, a real object store of each scheme, started
here on 127.0.0.1 (tests/support/object_stores.py): s3 on versitygw, gs on fake-gcs-server, az on
Azurite. The dataset is a URI in the bucket, checkpoint.exportTo a prefix in another, and the
credentials reach the trainer only as a cluster gives them: spec.objectStorage names Secret keys,
and the run's environment holds what the renderer's secretKeyRef entries resolve to. The export is
read back through the store's own API and compared with the run's.

The object store is touched only by the process `llmtrain run` starts: it copies the inputs before
training and pushes the export after, with or without Ray. The s3 run trains under Ray; gs and az
train without it (`--no-ray`, one process), which keeps each to a few seconds of training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.object_stores import Store, started
from tests.support.trainer import REPO, TINY_STORIES

pytestmark = pytest.mark.slow

STEPS = 6
# The store variables a developer's shell may hold: the run gets only the spec's.
STORE_VARIABLES = ("AWS_", "AZURE_", "GOOGLE_", "GCE_", "LLMTRAIN_GCS_", "LLMTRAIN_AZURE_", "RAY_ADDRESS")


def job_file(store: Store, folder: Path) -> Path:
    """examples/tiny-cpu.yaml, shortened, reading from and exporting to `store`."""
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    spec = job["spec"]
    spec["dataset"].update(path=f"{store.scheme}://corpus/stories/tiny-stories.txt", maxSeqLength=64)
    spec["training"].update(maxSteps=STEPS, logEverySteps=2)
    spec["checkpoint"].update(everySteps=STEPS, keep=1, exportTo=f"{store.scheme}://models/tiny-cpu/v1")
    spec["resources"]["workers"] = 1
    spec["objectStorage"] = store.object_storage
    path = folder / f"tiny-{store.scheme}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_llmtrain_run_reads_its_dataset_from_and_pushes_its_export_to_the_object_store(
    scheme: str, tmp_path: Path
) -> None:
    with started(scheme, tmp_path / "store") as store:
        store.put("corpus/stories/tiny-stories.txt", TINY_STORIES.read_bytes())
        env = {k: v for k, v in os.environ.items() if not k.startswith(STORE_VARIABLES)}
        env.update(store.pod_env())
        runs = tmp_path / "runs"
        command = [sys.executable, "-m", "llmtrain.cli", "run", str(job_file(store, tmp_path))]
        command += ["--runs-dir", str(runs), *([] if scheme == "s3" else ["--no-ray"])]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Export pushed to {scheme}://models/tiny-cpu/v1" in done.stdout

        keys = store.keys("models")
        assert "tiny-cpu/v1/config.json" in keys and "tiny-cpu/v1/model.safetensors" in keys, keys
        assert json.loads(store.read("models/tiny-cpu/v1/config.json"))["model_type"] == "llama"
        (export,) = runs.glob("*/*/export/model.safetensors")
        assert store.read("models/tiny-cpu/v1/model.safetensors") == export.read_bytes()
        assert store.uploads("models", "tiny-cpu/v1/model.safetensors") == 1
        # The trainer read the cached copy on the runs' storage, fetched once.
        (cached,) = (runs / ".object-cache").glob("*/tiny-stories.txt")
        assert cached.read_bytes() == TINY_STORIES.read_bytes()
        assert store.downloads("corpus", "stories/tiny-stories.txt") == 1
