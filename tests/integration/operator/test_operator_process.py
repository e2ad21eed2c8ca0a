"""`llmtrain operator` as it runs in its pod: a process with liveness, metrics, JSON logs and a
namespace scope, against the test API server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.integration.operator.conftest import eventually, phase_of, stored_rayjob, tiny_job
from tests.support.apiserver.server import ApiServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    """(status, body); (0, '') while the operator is not listening yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except OSError:
        return 0, ""


async def test_operator_process_probes_metrics_logs_and_scope(apiserver: ApiServer, tmp_path: Path) -> None:
    await apiserver.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}})
    liveness, metrics = _free_port(), _free_port()
    log = tmp_path / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(apiserver.kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmtrain.cli",
                "operator",
                "--namespace",
                "default",
                "--liveness-port",
                str(liveness),
                "--metrics-port",
                str(metrics),
                "--log-format",
                "json",
                "--trainer-image",
                "registry.example/trainer:9",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        await eventually(
            lambda: _get(f"http://127.0.0.1:{liveness}/healthz")[0] == 200, timeout=30, what="liveness"
        )
        await apiserver.create(tiny_job("proc"))
        await apiserver.create(
            {**tiny_job("ignored"), "metadata": {"name": "ignored", "namespace": "elsewhere"}}
        )
        await eventually(lambda: stored_rayjob(apiserver, "proc"), timeout=30, what="the RayJob")
        await eventually(lambda: phase_of(apiserver, "proc") == "Pending", what="status")
        rayjob = stored_rayjob(apiserver, "proc")
        head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]  # type: ignore[index]
        assert head["containers"][0]["image"] == "registry.example/trainer:9"
        body = await eventually(
            lambda: (
                (t := _get(f"http://127.0.0.1:{metrics}/metrics")[1])
                and 'llmtrain_jobs{phase="Pending"} 1.0' in t
                and t
            ),
            what="the jobs gauge",
        )
        assert "llmtrain_reconcile_duration_seconds_count 1.0" in body
        assert "llmtrain_errors_total" in body
        # Scoped to its namespace: the job elsewhere is left alone.
        assert apiserver.stored("ray.io/v1", "RayJob", "elsewhere", "ignored") is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    assert lines, log.read_text()[-2000:]
    records = [json.loads(line) for line in lines]
    assert any(r.get("object", {}).get("name") == "proc" for r in records)
