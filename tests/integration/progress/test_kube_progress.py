"""The trainer's Kubernetes progress reporter against the test API server: patches land through the
status subresource, are rate-limited, survive 500s, and never block the training loop."""

from __future__ import annotations

import asyncio
import time

from llmtrain_trainer.kube_progress import ApiTarget, KubernetesProgressSink
from llmtrain_trainer.metrics import MetricsRecord

from tests.support.apiserver.server import ApiServer
from tests.support.jobs import minimal_job

JOB = ("llmtrain.dev/v1alpha1", "LLMTrainingJob")
STATUS_RESOURCE = "llmtrainingjobs/status"


async def _job(apiserver: ApiServer, name: str) -> None:
    await apiserver.create(minimal_job(name))
    await apiserver.patch_status(
        *JOB, "default", name, {"status": {"phase": "Running", "message": "operator-owned"}}
    )


def _sink(apiserver: ApiServer, name: str, interval: float) -> KubernetesProgressSink:
    return KubernetesProgressSink(ApiTarget(apiserver.url, "token", None), "default", name, interval=interval)


def _step(step: int, loss: float, event: str = "step", path: str | None = None) -> MetricsRecord:
    return MetricsRecord(
        event=event,
        step=step,
        total_steps=100,
        loss=loss,
        learning_rate=1e-3,  # type: ignore[arg-type]
        tokens_per_second=1234.5,
        eta_seconds=60.0,
        epoch=0,
        path=path,
    )


def _progress(apiserver: ApiServer, name: str) -> dict:
    return ((apiserver.stored(*JOB, "default", name) or {}).get("status") or {}).get("progress") or {}


async def _until(check, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def _status_patches(apiserver: ApiServer, name: str) -> list:
    return [
        r
        for r in apiserver.requests()
        if r.resource is not None
        and r.resource.plural == "llmtrainingjobs"
        and r.name == name
        and r.subresource == "status"
        and r.method.value == "PATCH"
        and not r.headers.get("User-Agent", "").startswith("Python/3")
    ]


async def test_patches_land_in_status_progress_only(apiserver: ApiServer) -> None:
    await _job(apiserver, "lands")
    sink = _sink(apiserver, "lands", interval=0.2)
    sink.emit(_step(10, 2.5))
    await _until(lambda: _progress(apiserver, "lands").get("step") == 10)
    sink.emit(_step(20, 2.0, event="checkpoint", path="/mnt/llmtrain/runs/default/lands/checkpoint_000001"))
    await asyncio.to_thread(sink.close)
    progress = _progress(apiserver, "lands")
    assert progress["summary"] == "20/100" and progress["totalSteps"] == 100
    assert progress["loss"] == 2.0 and progress["tokensPerSecond"] == 1234.5 and progress["etaSeconds"] == 60
    assert progress["lastCheckpoint"] == {
        "path": "/mnt/llmtrain/runs/default/lands/checkpoint_000001",
        "step": 20,
    }
    assert progress["updatedAt"].endswith("Z")
    status = apiserver.stored(*JOB, "default", "lands")["status"]  # type: ignore[index]
    assert status["phase"] == "Running" and status["message"] == "operator-owned"
    # Only PATCHes of this job's status: exactly what the per-job Role grants.
    assert {(r.method.value, r.subresource) for r in _status_patches(apiserver, "lands")} == {
        ("PATCH", "status")
    }


async def test_rate_limited_to_the_interval_newest_state_wins(apiserver: ApiServer) -> None:
    await _job(apiserver, "limited")
    sink = _sink(apiserver, "limited", interval=0.5)
    started = time.monotonic()
    for step in range(1, 61):
        sink.emit(_step(step, 3.0 - step / 100))
        await asyncio.sleep(0.02)  # 60 steps over ~1.2 s
    elapsed = time.monotonic() - started
    await asyncio.to_thread(sink.close)
    assert _progress(apiserver, "limited")["step"] == 60
    # At most one patch per interval plus the final flush.
    assert sink.patches_sent <= int(elapsed / 0.5) + 2, (sink.patches_sent, elapsed)
    assert len(_status_patches(apiserver, "limited")) == sink.patches_sent


async def test_checkpoint_is_reported_at_once_despite_the_interval(apiserver: ApiServer) -> None:
    await _job(apiserver, "urgent")
    sink = _sink(apiserver, "urgent", interval=60)
    sink.emit(_step(1, 3.0))
    await _until(lambda: _progress(apiserver, "urgent").get("step") == 1)
    sink.emit(_step(40, 2.0, event="checkpoint", path="/ckpt/40"))
    await _until(
        lambda: _progress(apiserver, "urgent").get("lastCheckpoint", {}).get("step") == 40, timeout=5
    )
    await asyncio.to_thread(sink.close)


async def test_survives_server_errors_and_sends_only_the_newest(apiserver: ApiServer) -> None:
    await _job(apiserver, "flaky")
    apiserver.faults.fail("patch", STATUS_RESOURCE, 500, times=3)
    sink = _sink(apiserver, "flaky", interval=0.1)
    sink._max_backoff = 0.3
    for step in (1, 2, 3):
        sink.emit(_step(step, 3.0))
    await _until(lambda: _progress(apiserver, "flaky").get("step") == 3, timeout=15)
    assert sink.failures >= 3
    sent_steps = [p.data["status"]["progress"]["step"] for p in _status_patches(apiserver, "flaky")]
    assert sent_steps[-1] == 3 and sorted(sent_steps) == sent_steps  # never an older state after a newer one
    await asyncio.to_thread(sink.close)


async def test_never_blocks_the_training_loop(apiserver: ApiServer) -> None:
    await _job(apiserver, "slow")
    apiserver.faults.delay("patch", STATUS_RESOURCE, 3.0)
    sink = _sink(apiserver, "slow", interval=0.01)
    worst = 0.0
    for step in range(200):
        t = time.perf_counter()
        sink.emit(_step(step, 1.0))
        worst = max(worst, time.perf_counter() - t)
    assert worst < 0.05, f"emit() took {worst:.3f}s while the API server was slow"
    t = time.monotonic()
    await asyncio.to_thread(sink.close, 1.0)  # bounded flush, even with a hanging server
    assert time.monotonic() - t < 2.5
    apiserver.faults.clear()


async def test_unreachable_server_is_dropped_silently(apiserver: ApiServer) -> None:
    sink = KubernetesProgressSink(
        ApiTarget("http://127.0.0.1:9", None, None), "default", "nobody", interval=0.05
    )
    for step in range(20):
        sink.emit(_step(step, 1.0))
    await asyncio.to_thread(sink.close, 1.0)
    assert sink.patches_sent == 0 and sink.failures >= 1


async def test_error_root_cause_is_reported(apiserver: ApiServer) -> None:
    await _job(apiserver, "oom")
    sink = _sink(apiserver, "oom", interval=30)
    sink.emit(_step(5, 2.0))
    sink.report_error("OutOfMemoryError on rank 3: CUDA out of memory")
    await asyncio.to_thread(sink.close)
    assert _progress(apiserver, "oom")["error"] == "OutOfMemoryError on rank 3: CUDA out of memory"
