"""`llmtrain run` with its data in, and its model out to, a real S3 server (versitygw, started
here on 127.0.0.1): the dataset is an s3:// URI, checkpoint.exportTo an s3:// prefix, and the
credentials reach the trainer only through the environment (what spec.objectStorage's secretKeyRef
entries give the Ray containers on a cluster). The export is listed back with the S3 API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.s3 import requests, versitygw
from tests.support.trainer import REPO

pytestmark = pytest.mark.slow

STEPS = 6


def test_llmtrain_run_reads_its_dataset_from_s3_and_pushes_its_export_to_s3(tmp_path: Path) -> None:
    with versitygw(tmp_path / "s3") as s3:
        client = s3.client()
        client.create_dir("corpus")
        client.create_dir("models")
        with client.open_output_stream("corpus/stories/tiny-stories.txt") as out:
            out.write((REPO / "examples" / "data" / "tiny-stories.txt").read_bytes())
        job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
        spec = job["spec"]
        spec["dataset"].update(path="s3://corpus/stories/tiny-stories.txt", maxSeqLength=64)
        spec["training"].update(maxSteps=STEPS, logEverySteps=2)
        spec["checkpoint"].update(everySteps=STEPS, keep=1, exportTo="s3://models/tiny-cpu/v1")
        spec["resources"]["workers"] = 1
        spec["objectStorage"] = {
            "endpoint": s3.endpoint,
            "accessKeySecretRef": {"name": "s3-creds", "key": "access-key"},
            "secretKeySecretRef": {"name": "s3-creds", "key": "secret-key"},
        }
        job_file = tmp_path / "tiny-s3.yaml"
        job_file.write_text(yaml.safe_dump(job))
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update({k: v for k, v in s3.env.items() if k != "AWS_ENDPOINT_URL"})  # the spec's endpoint
        command = [
            sys.executable,
            "-m",
            "llmtrain.cli",
            "run",
            str(job_file),
            "--runs-dir",
            str(tmp_path / "runs"),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Export pushed to s3://models/tiny-cpu/v1" in done.stdout

        keys = s3.keys("models")
        assert "tiny-cpu/v1/config.json" in keys and "tiny-cpu/v1/model.safetensors" in keys, keys
        with client.open_input_stream("models/tiny-cpu/v1/config.json") as body:
            assert json.loads(body.read())["model_type"] == "llama"
        # The trainer read the cached copy on the runs' storage, fetched once.
        cached = list((tmp_path / "runs" / ".object-cache").glob("*/tiny-stories.txt"))
        assert len(cached) == 1
        assert cached[0].read_bytes() == (REPO / "examples" / "data" / "tiny-stories.txt").read_bytes()
        assert requests(s3, "GetObject", "stories/tiny-stories.txt") == 1
