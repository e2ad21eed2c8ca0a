"""The trainer's progress reporter (`llmtrain_trainer.kube_progress`) against the real API server,
authenticated as in a Ray pod: by a token of the job's own ServiceAccount (made by the operator for a
suspended job, so no Ray cluster is needed), verifying the server's certificate with the cluster CA.

The reporter's requests go through `FaultProxy`, which records each one (verb, resource, status) and
injects 500s and latency by rule. This proves that the reporter's patches land in `status.progress`
only, through the status subresource its per-job Role grants, leaving the operator's fields alone;
that they are rate-limited to the interval with the newest state winning, except a checkpoint, which
is sent at once; that 500s are survived and never followed by a stale state; that a slow or
unreachable API server never blocks the training loop; and that a failed run's root cause is reported.

End to end, a real trainer process (`python -m llmtrain_trainer.main`) trains the tiny CPU model with
progress reporting on, configured outside a pod by $LLMTRAIN_API_SERVER, $LLMTRAIN_API_TOKEN and
$LLMTRAIN_API_CA_FILE, and the job's printer columns (the served CRD's JSONPaths over every stored
version, and the real `kubectl get llmtj`) advance while it runs.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llmtrain.api.trainer_config import ProgressSpec
from llmtrain.api.validation import parse_job
from llmtrain.render.trainer_config import local_trainer_config
from llmtrain_trainer.kube_progress import (
    API_CA_FILE_ENV,
    API_SERVER_ENV,
    API_TOKEN_ENV,
    ApiTarget,
    KubernetesProgressSink,
)
from llmtrain_trainer.metrics import Event, MetricsRecord

from tests.cluster.test_progress_rbac import trainer_token
from tests.support.cluster import processes
from tests.support.cluster.cluster import REPO_ROOT, Cluster
from tests.support.cluster.fault_proxy import FaultProxy, Seen
from tests.support.cluster.steps import (
    OperatorProcess,
    Watch,
    apply_doc,
    cpu_job,
    get,
    job_status,
    table,
    wait_for,
)
from tests.support.jobs import load_example

STATUS = "llmtrainingjobs/status"
STEPS = 24

pytestmark = pytest.mark.usefixtures("jobs_deleted_first")


@pytest.fixture(scope="module")
def module_proxy(cluster: Cluster) -> Iterator[FaultProxy]:
    with FaultProxy(cluster) as p:
        yield p


@pytest.fixture
def proxy(module_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The reporter's way to the API server, with no rules before and after the test. Only reporters
    use it (the operator talks to the API server directly), so its rules touch nothing else."""
    module_proxy.clear()
    yield module_proxy
    module_proxy.clear()


def ca_file(cluster: Cluster) -> str:
    return str(cluster.directory / "pki" / "ca.crt")


def suspended_job(cluster: Cluster, namespace: str, name: str) -> str:
    """A suspended job (its identity, no Ray cluster); a token of its ServiceAccount once RBAC lets
    that account patch the job's status."""
    apply_doc(cluster, cpu_job(name, namespace, suspend=True))
    return trainer_token(cluster, namespace, name)


def settled_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The suspended job's status once the operator is done with it: KubeRay has reported the
    suspended RayJob Suspended (first Suspending, which the operator mirrors too)."""

    def settled() -> dict[str, Any]:
        status = job_status(cluster, namespace, name)
        assert status.get("phase") == "Suspended", status
        assert str(status.get("message")).startswith("suspended;"), status
        return status

    found: dict[str, Any] = wait_for(settled, timeout=180, what=f"{namespace}/{name} settled as Suspended")
    return found


def sink_via(
    proxy: FaultProxy, cluster: Cluster, token: str, namespace: str, name: str, **kwargs: Any
) -> KubernetesProgressSink:
    """The reporter as a Ray pod runs it (job token, cluster CA), reaching the API server via `proxy`."""
    return KubernetesProgressSink(ApiTarget(proxy.url, token, ca_file(cluster)), namespace, name, **kwargs)


def step(step: int, loss: float, event: Event = "step", path: str | None = None) -> MetricsRecord:
    return MetricsRecord(
        event=event,
        step=step,
        total_steps=100,
        loss=loss,
        learning_rate=1e-3,
        tokens_per_second=1234.5,
        eta_seconds=60.0,
        epoch=0,
        path=path,
    )


def progress(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = job_status(cluster, namespace, name).get("progress") or {}
    return found


def reporter_requests(proxy: FaultProxy, namespace: str) -> list[Seen]:
    return [r for r in proxy.requests if r.namespace == namespace]


def stored_steps(watch: Watch, name: str) -> list[int]:
    """status.progress.step as the API server stored it, in order, each change once (the operator's
    own status writes store the same step again)."""
    steps = [
        v["status"]["progress"]["step"]
        for v in watch.versions(name)
        if "step" in ((v.get("status") or {}).get("progress") or {})
    ]
    return [s for s, _ in itertools.groupby(steps)]


def test_patches_land_in_status_progress_only(
    cluster: Cluster, operator: OperatorProcess, namespace: str, proxy: FaultProxy
) -> None:
    token = suspended_job(cluster, namespace, "lands")
    before = settled_status(cluster, namespace, "lands")
    sink = sink_via(proxy, cluster, token, namespace, "lands", interval=0.2)
    sink.emit(step(10, 2.5))
    wait_for(lambda: progress(cluster, namespace, "lands").get("step") == 10, what="step 10 stored")
    checkpoint = f"/mnt/llmtrain/runs/{namespace}/lands/checkpoint_000001"
    sink.emit(MetricsRecord("validation", 20, 100, val_loss=2.25, best_val_loss=2.125, best_step=15))
    sink.emit(step(20, 2.0, event="checkpoint", path=checkpoint))
    sink.close()
    assert sink.failures == 0, sink.failures

    stored = progress(cluster, namespace, "lands")
    updated_at = stored.pop("updatedAt")
    # Every field the reporter sends survives the CRD schema's pruning.
    assert stored == {
        "step": 20,
        "totalSteps": 100,
        "summary": "20/100",
        "epoch": 0,
        "loss": 2.0,
        "learningRate": 0.001,
        "tokensPerSecond": 1234.5,
        "etaSeconds": 60,
        "lastCheckpoint": {"path": checkpoint, "step": 20},
        "evalLoss": 2.25,
        "evalStep": 20,
        "bestEvalLoss": 2.125,
        "bestStep": 15,
    }, stored
    assert isinstance(updated_at, str) and updated_at.endswith("Z"), updated_at
    # The operator's fields are left as it wrote them.
    status = job_status(cluster, namespace, "lands")
    assert (status["phase"], status.get("message")) == (before["phase"], before.get("message")), status
    # Only PATCHes of this job's status, each allowed by the per-job Role: exactly what it grants.
    seen = reporter_requests(proxy, namespace)
    assert {(r.verb, r.resource, r.name, r.status) for r in seen} == {("patch", STATUS, "lands", 200)}, seen
    assert len(seen) == sink.patches_sent >= 2, (seen, sink.patches_sent)


def test_rate_limited_to_the_interval_newest_state_wins(
    cluster: Cluster, operator: OperatorProcess, namespace: str, proxy: FaultProxy
) -> None:
    token = suspended_job(cluster, namespace, "limited")
    sink = sink_via(proxy, cluster, token, namespace, "limited", interval=0.5)
    started = time.monotonic()
    for n in range(1, 61):
        sink.emit(step(n, 3.0 - n / 100))
        time.sleep(0.02)  # 60 steps over at least 1.2 s
    elapsed = time.monotonic() - started
    sink.close()
    assert sink.failures == 0, sink.failures
    assert progress(cluster, namespace, "limited")["step"] == 60
    # At most one patch per interval plus the final flush.
    assert 1 <= sink.patches_sent <= int(elapsed / 0.5) + 2, (sink.patches_sent, elapsed)
    patches = reporter_requests(proxy, namespace)
    assert [(r.verb, r.resource, r.status) for r in patches] == [("patch", STATUS, 200)] * sink.patches_sent
    gaps = [b.at - a.at for a, b in itertools.pairwise(patches)]
    # Each answer is recorded after its request was sent; the next is sent an interval after the
    # previous answer, so consecutive answers are at least an interval apart (less a little slack,
    # except the final flush, which close() sends at once).
    assert all(gap >= 0.45 for gap in gaps[:-1]), gaps


def test_checkpoint_is_reported_at_once_despite_the_interval(
    cluster: Cluster, operator: OperatorProcess, namespace: str, proxy: FaultProxy
) -> None:
    token = suspended_job(cluster, namespace, "urgent")
    sink = sink_via(proxy, cluster, token, namespace, "urgent", interval=600)
    sink.emit(step(1, 3.0))
    wait_for(lambda: progress(cluster, namespace, "urgent").get("step") == 1, what="step 1 stored")
    sink.emit(step(2, 2.9))  # an ordinary step waits for the interval...
    sink.emit(step(40, 2.0, event="checkpoint", path="/ckpt/40"))  # ...a checkpoint does not
    wait_for(
        lambda: progress(cluster, namespace, "urgent").get("lastCheckpoint", {}).get("step") == 40,
        timeout=120,
        what="the checkpoint stored",
    )  # far sooner than the 600 s interval
    sink.close()
    assert len(reporter_requests(proxy, namespace)) == sink.patches_sent == 2, sink.patches_sent


def test_survives_server_errors_and_sends_only_the_newest(
    cluster: Cluster, operator: OperatorProcess, namespace: str, proxy: FaultProxy
) -> None:
    token = suspended_job(cluster, namespace, "flaky")
    with Watch(cluster, "llmtj", namespace) as watch:
        rule = proxy.fail("patch", STATUS, 500, times=3)
        sink = sink_via(proxy, cluster, token, namespace, "flaky", interval=0.1, max_backoff=0.3)
        for n in (1, 2, 3):
            sink.emit(step(n, 3.0))
        wait_for(
            lambda: progress(cluster, namespace, "flaky").get("step") == 3, timeout=90, what="step 3 stored"
        )
        wait_for(lambda: stored_steps(watch, "flaky")[-1:] == [3], what="the watch to see step 3")
        sink.close()
        assert rule.hits == 3 and sink.failures == 3, (rule.hits, sink.failures)
        answers = [(r.verb, r.status, r.injected) for r in reporter_requests(proxy, namespace)]
        assert answers == [("patch", 500, True)] * 3 + [("patch", 200, False)], answers
        # Only the newest state was stored after the errors: never an older one, not even once.
        assert stored_steps(watch, "flaky") == [3]


def test_never_blocks_the_training_loop(
    cluster: Cluster, operator: OperatorProcess, namespace: str, proxy: FaultProxy
) -> None:
    token = suspended_job(cluster, namespace, "slow")
    rule = proxy.delay("patch", STATUS, 20.0)
    sink = sink_via(proxy, cluster, token, namespace, "slow", interval=0.01)
    worst = 0.0
    for n in range(200):
        t = time.perf_counter()
        sink.emit(step(n, 1.0))
        worst = max(worst, time.perf_counter() - t)
    # A blocking emit() would wait for the held patch (until the reporter's 10 s timeout at least);
    # a scheduling hiccup on a busy machine takes far less.
    assert worst < 1.0, f"emit() took {worst:.3f}s while the API server was slow"
    wait_for(lambda: rule.hits >= 1, timeout=30, what="a patch held by the proxy")
    t = time.monotonic()
    sink.close(1.0)  # bounded flush, even with a hanging server
    assert time.monotonic() - t < 5
    assert sink.patches_sent == 0  # the held patch had not been answered: close() did not wait for it


def test_unreachable_server_is_dropped_silently(cluster: Cluster) -> None:
    closed = f"https://127.0.0.1:{processes.free_port()}"  # nothing listens there
    target = ApiTarget(closed, "token", ca_file(cluster))
    sink = KubernetesProgressSink(target, "default", "nobody", interval=0.05)
    for n in range(20):
        sink.emit(step(n, 1.0))
    wait_for(lambda: sink.failures >= 1, timeout=30, what="a failed patch")
    t = time.monotonic()
    sink.close(1.0)
    assert time.monotonic() - t < 5
    assert sink.patches_sent == 0 and sink.failures >= 1


def test_error_root_cause_is_reported(
    cluster: Cluster, operator: OperatorProcess, namespace: str, proxy: FaultProxy
) -> None:
    token = suspended_job(cluster, namespace, "oom")
    sink = sink_via(proxy, cluster, token, namespace, "oom", interval=600)
    sink.emit(step(5, 2.0))
    sink.report_error("OutOfMemoryError on rank 3: CUDA out of memory")
    sink.close()
    assert sink.failures == 0, sink.failures
    stored = progress(cluster, namespace, "oom")
    assert stored["error"] == "OutOfMemoryError on rank 3: CUDA out of memory", stored
    assert stored["step"] == 5, stored


# ---- a real trainer process -------------------------------------------------------------------


def printer_columns(cluster: Cluster) -> list[dict[str, Any]]:
    """The additionalPrinterColumns of the served CRD: what `kubectl get llmtj` is computed from."""
    crd = get(cluster, "crd", "llmtrainingjobs.llmtrain.dev")
    assert crd is not None
    [version] = [v for v in crd["spec"]["versions"] if v["served"]]
    columns: list[dict[str, Any]] = version["additionalPrinterColumns"]
    return columns


def column_values(columns: list[dict[str, Any]], obj: dict[str, Any]) -> dict[str, Any]:
    """Each printer column's simple JSONPath (.a.b.c) over `obj`, as the API server evaluates it."""
    out: dict[str, Any] = {}
    for column in columns:
        node: Any = obj
        for part in column["jsonPath"].strip(".").split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[column["name"]] = node
    return out


@pytest.mark.slow
@pytest.mark.parametrize("example", ["tiny-cpu.yaml", "tiny-cpu-hf.yaml", "tiny-cpu-custom.yaml"])
def test_printer_columns_advance_while_a_trainer_process_trains(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path, example: str
) -> None:
    """Every trainer mode (built-in, Hugging Face Trainer, a custom function) feeds the same
    reporter: the job's status and `kubectl get` advance while it trains."""
    doc = load_example(example)
    doc["metadata"].update(name="live", namespace=namespace)
    doc["spec"]["training"].update(maxSteps=STEPS, logEverySteps=4)
    doc["spec"]["checkpoint"].update(everySteps=12)
    doc["spec"]["runPolicy"]["suspend"] = True  # the job's identity, no Ray cluster: it trains here
    apply_doc(cluster, doc)
    token = trainer_token(cluster, namespace, "live")
    columns = printer_columns(cluster)

    config = local_trainer_config(parse_job(doc), REPO_ROOT / "examples", tmp_path / "runs")
    config = config.model_copy(
        update={"progress": ProgressSpec(report_to_kubernetes=True, interval_seconds=0.5)}
    )
    assert (config.job.namespace, config.job.name) == (namespace, "live")
    config_file = tmp_path / "trainer-config.json"
    config_file.write_text(config.model_dump_json(by_alias=True))
    # Outside a pod the reporter is configured by these alone: the real API server's address, the
    # job's own token, and the CA to verify the server's certificate with.
    env = {
        **os.environ,
        API_SERVER_ENV: cluster.server,
        API_TOKEN_ENV: token,
        API_CA_FILE_ENV: ca_file(cluster),
    }
    for name in ("RAY_ADDRESS", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(name, None)

    with Watch(cluster, "llmtj", namespace) as watch:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmtrain_trainer.main", "--config", str(config_file)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output, _ = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, output[-4000:]
        # Every version the process stored (nothing else writes progress), once the watch has them.
        final_version = (get(cluster, "llmtj", "live", namespace) or {})["metadata"]["resourceVersion"]
        wait_for(
            lambda: any(v["metadata"]["resourceVersion"] == final_version for v in watch.versions("live")),
            what="the watch to see the last stored version",
        )
        stored = [column_values(columns, v) for v in watch.versions("live")]

    seen: list[dict[str, Any]] = []
    for values in stored:
        if values["Progress"] and (not seen or seen[-1]["Progress"] != values["Progress"]):
            seen.append(values)
    steps = [int(c["Progress"].split("/")[0]) for c in seen]
    assert len(steps) >= 3, seen  # advancing while training ran, not only at the end
    assert steps == sorted(steps) and steps[-1] == STEPS, steps
    final = seen[-1]
    assert final["Progress"] == f"{STEPS}/{STEPS}", final
    first_loss = next(c["Loss"] for c in seen if c["Loss"] is not None)
    assert isinstance(final["Loss"], float) and final["Loss"] < first_loss, seen
    # Every mode measures throughput (HF: the Trainer's tokens seen; custom: the example's report).
    assert final["Tokens/s"] and final["Tokens/s"] > 0, final

    # What a user sees: the real kubectl's table, computed by the API server from the same columns.
    [row] = table(cluster.kubectl("get", "llmtj", "live", "-n", namespace, "-o", "wide").stdout)
    assert row["PROGRESS"] == f"{STEPS}/{STEPS}", row
    assert float(row["LOSS"]) == final["Loss"], (row, final)
    assert float(row["TOKENS/S"]) == final["Tokens/s"] > 0, (row, final)
    progress_block = job_status(cluster, namespace, "live")["progress"]
    assert progress_block["lastCheckpoint"]["step"] in (12, 24), progress_block
    assert progress_block["lastCheckpoint"]["path"].startswith(str(tmp_path / "runs" / "live")), (
        progress_block
    )
