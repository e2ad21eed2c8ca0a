"""A user's whole journey with an object store and an experiment tracker, in real pods (issue #24).

From a fresh cluster: put the corpus in S3, create the store's key Secret and allow it in the
namespace, `llmtrain submit` examples/tiny-cpu-s3.yaml (pointed at the store, tracking to MLflow),
`llmtrain watch` it to the end and `llmtrain logs -f` it, read its metrics back from the MLflow
server, `kubectl delete llmtj` it (its claim goes with it: `reclaim: Delete`) and load the exported
model from S3. The S3 server (versitygw) and the MLflow server are real, and run where the pods
reach them: as processes inside the node's network namespace, on the node's IP (as CoreDNS does),
never on another address; the test reaches them through the node's veth.

The commands and their output go to `<tmp>/transcript.txt` (printed at the end), the terminal
session the issue's closing note shows.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from llmtrain.constants import ALLOWED_SECRETS_ANNOTATION

from tests.pods import jobs
from tests.pods.conftest import Release
from tests.support import s3, tracking
from tests.support.cluster import netns, node
from tests.support.cluster.cluster import Cluster

EXAMPLE = jobs.REPO_ROOT / "examples" / "tiny-cpu-s3.yaml"
CORPUS = jobs.REPO_ROOT / "examples" / "data" / "tiny-stories.txt"
SECRET = "s3-creds"
EXPORT_TO = "s3://models/tiny-cpu/v1"
STEPS = 30
LOG_EVERY = 5


class Session:
    """Runs what a user types, with KUBECONFIG set as they would have it, and keeps a transcript."""

    def __init__(self, cluster: Cluster, path: Path) -> None:
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        self.path = path
        path.write_text("")

    def note(self, text: str) -> None:
        with self.path.open("a") as out:
            out.write(text.rstrip("\n") + "\n")

    def run(self, *argv: str, shown: str | None = None, timeout: float = 900) -> str:
        """Run `argv` (llmtrain and kubectl by their full paths); its stdout and stderr together,
        in the transcript under the command as typed. Fails unless it exits 0."""
        result = subprocess.run(
            argv,
            env=self.env,
            cwd=jobs.REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        typed = shown or " ".join([Path(argv[0]).name, *argv[1:]])
        self.note(f"$ {typed}\n{result.stdout}")
        assert result.returncode == 0, f"{typed} exited {result.returncode}:\n{result.stdout[-4000:]}"
        return result.stdout


def _job(namespace: str, endpoint: str, mlflow_url: str) -> dict[str, Any]:
    """examples/tiny-cpu-s3.yaml pointed at the test's store, tracking to its MLflow server, short
    and at the one-worker shape of the other scenarios with a whole-core head (the job has the
    node to itself), on a claim of its own deleted with it."""
    job = jobs.variant(
        "tiny-cpu-s3",
        base=EXAMPLE,
        resources=jobs.WHOLE_HEAD_SHAPE,
        training={"maxSteps": STEPS, "logEverySteps": LOG_EVERY},
        checkpoint={"everySteps": 10, "exportTo": EXPORT_TO},
        objectStorage={"endpoint": endpoint},
    )
    job["metadata"]["namespace"] = namespace
    job["spec"]["storage"] = {"create": {"size": "1Gi", "reclaim": "Delete"}}
    job["spec"]["tracking"] = {"mlflow": {"trackingUri": mlflow_url}}
    return job


def _load_export(folder: Path) -> int:
    """Load the downloaded export with transformers and generate: the tokens it returns."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    out = model.generate(torch.tensor([[72, 101, 108]]), max_new_tokens=8, do_sample=False)
    return int(out.shape[-1])


def test_a_job_reads_s3_tracks_to_mlflow_and_leaves_its_export_in_s3_after_delete(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    info = node.NodeInfo.load(cluster.directory)
    assert info is not None, "the pods tier's cluster has a real node"
    net = netns.NodeNetwork(info.netns, "", info.host_ip, info.node_ip)
    user = Session(cluster, tmp_path / "transcript.txt")
    llmtrain, kubectl = str(jobs.LLMTRAIN), cluster.bins["kubectl"]
    started = time.monotonic()
    with (
        s3.versitygw(tmp_path / "s3", host=info.node_ip, enter=net.enter) as store,
        tracking.mlflow_server(tmp_path / "mlflow", host=info.node_ip, enter=net.enter) as mlflow_url,
    ):
        servers = time.monotonic()
        # 1. The corpus into the store, through the S3 API (pyarrow's client, as `aws s3 cp` would).
        client = store.client()
        client.create_dir("corpus")
        client.create_dir("models")  # the export's bucket: the trainer writes keys, makes no bucket
        with client.open_output_stream("corpus/tiny-stories.txt") as out:
            out.write(CORPUS.read_bytes())
        user.note(
            f"# S3 at {store.endpoint}, MLflow at {mlflow_url} (both on the node's IP)\n"
            "$ aws s3 mb s3://corpus && aws s3 mb s3://models   # buckets, by pyarrow's S3 client\n"
            f"$ aws s3 cp {CORPUS.relative_to(jobs.REPO_ROOT)} s3://corpus/tiny-stories.txt"
            f"   # done with pyarrow's S3 client\nupload: s3://corpus/tiny-stories.txt "
            f"({CORPUS.stat().st_size} bytes)"
        )

        # 2. The store's keys as a Secret the namespace allows its jobs to use.
        user.run(
            kubectl, "-n", namespace, "create", "secret", "generic", SECRET,
            f"--from-literal=access-key={s3.ACCESS_KEY}", f"--from-literal=secret-key={s3.SECRET_KEY}",
            shown=f"kubectl -n {namespace} create secret generic {SECRET} "
            "--from-literal=access-key=... --from-literal=secret-key=...",
        )  # fmt: skip
        user.run(
            kubectl,
            "annotate",
            "namespace",
            namespace,
            f"{ALLOWED_SECRETS_ANNOTATION}={SECRET}",
            "--overwrite",
        )

        # 3. Submit, watch, follow the logs.
        job = _job(namespace, store.endpoint, mlflow_url)
        name = job["metadata"]["name"]
        spec_file = tmp_path / "tiny-cpu-s3.yaml"
        spec_file.write_text(yaml.safe_dump(job, sort_keys=False))
        user.note(f"# {spec_file.name}: examples/tiny-cpu-s3.yaml with endpoint, tracking, {STEPS} steps")
        user.run(
            llmtrain,
            "submit",
            str(spec_file),
            "--no-follow",
            shown=f"llmtrain submit {spec_file.name} --no-follow",
        )
        submitted = time.monotonic()
        watched = user.run(llmtrain, "watch", name, "-n", namespace)
        done = time.monotonic()
        lines = watched.splitlines()
        # Its last bar (stdout; the phase's message follows on stderr) is the finished run's.
        bars = [line for line in lines if "[" in line]
        assert bars[-1].startswith("Succeeded") and f"{STEPS}/{STEPS} 100%" in bars[-1], watched[-3000:]
        assert lines[-1] == "Succeeded: training finished", watched[-3000:]
        # The bar moved through the run (a line per change when not on a terminal).
        assert len([line for line in lines if line.startswith("Running") and "/" in line]) >= 2, watched
        logs = user.run(llmtrain, "logs", "-f", name, "-n", namespace)
        assert f"step {STEPS}/{STEPS}" in logs and "(submitter)" in logs, logs[-3000:]
        assert f"export pushed to {EXPORT_TO}" in logs, logs[-3000:]
        status = user.run(llmtrain, "status", name, "-n", namespace)
        assert f"Exported to:  {EXPORT_TO}" in status.splitlines(), status

        # The driver read the corpus from the store, from a pod's address (the pod network).
        reads = [line.split() for line in store.access_log.read_text().splitlines()]
        readers = [fields[4] for fields in reads if fields[7:9] == ["s3_GetObject", "tiny-stories.txt"]]
        pods = ipaddress.ip_network(node.POD_CIDR)
        assert readers and all(ipaddress.ip_address(ip) in pods for ip in readers), reads

        # 4. The run's metrics on the MLflow server (the experiment defaults to the job's name).
        (run,) = tracking.mlflow_runs(mlflow_url, name)
        assert run.info.status == "FINISHED", run.info
        loss = tracking.mlflow_history(mlflow_url, run.info.run_id, "loss")
        assert set(range(LOG_EVERY, STEPS + 1, LOG_EVERY)) <= set(loss) and max(loss) == STEPS, loss
        assert loss[STEPS] < loss[LOG_EVERY], loss
        assert tracking.mlflow_history(mlflow_url, run.info.run_id, "learning_rate"), run.data.metrics
        user.note(
            f'$ python -c \'MlflowClient("{mlflow_url}").get_metric_history(run_id, "loss")\'\n'
            + json.dumps({step: round(value, 4) for step, value in sorted(loss.items())})
        )

        # 5. Delete the job (and its claim, with the export on it): the export stays in S3.
        user.run(kubectl, "-n", namespace, "delete", "llmtj", name, "--wait=true")
        jobs.wait_no_ray_pods(cluster, namespace, name)
        claims = cluster.kubectl("get", "pvc", "-n", namespace, "-o", "name").stdout.split()
        deadline = time.monotonic() + 120
        while claims and time.monotonic() < deadline:
            time.sleep(2)
            claims = cluster.kubectl("get", "pvc", "-n", namespace, "-o", "name").stdout.split()
        assert not claims, f"the job's claim outlived it: {claims}"
        keys = store.keys("models")
        user.note("$ aws s3 ls --recursive s3://models/   # pyarrow's S3 client\n" + "\n".join(keys))
        assert {"tiny-cpu/v1/config.json", "tiny-cpu/v1/model.safetensors"} <= set(keys), keys
        export = tmp_path / "export"
        export.mkdir()
        from pyarrow import fs

        fs.copy_files("models/tiny-cpu/v1", str(export), client, fs.LocalFileSystem())
        generated = _load_export(export)
        assert generated == 3 + 8, generated
        user.note(f"$ python -c 'AutoModelForCausalLM.from_pretrained(\"{export.name}\").generate(...)'\n"
                  f"{generated} tokens")  # fmt: skip

    print(
        f"\nservers up {servers - started:.0f} s, submit to Succeeded {done - submitted:.0f} s, "
        f"total {time.monotonic() - started:.0f} s; transcript {user.path}"
    )
