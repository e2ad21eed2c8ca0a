"""Operator throughput: N LLMTrainingJobs created in the test API server; time until every one has
its RayJob and a status, create→RayJob latency percentiles, and the operator process's peak RSS.

The operator runs as `llmtrain operator` in its own process (as in a pod); the API server runs in
this process. Last line: `jobs=… total_s=… p50_ms=… p99_ms=… rss_mb=…`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.apiserver.fixtures import (  # noqa: E402
    KUBERAY_CRD_FILES,
    PROJECT_CRD_DIR,
    crd_documents,
    write_kubeconfig,
)
from tests.support.apiserver.server import ApiServer  # noqa: E402
from tests.support.jobs import minimal_job  # noqa: E402
from tests.support.kuberay import kuberay_crd_dir  # noqa: E402

JOB = ("llmtrain.dev/v1alpha1", "LLMTrainingJob")
RAYJOB = ("ray.io/v1", "RayJob")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set size."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def requests_per_job(server: ApiServer, jobs: int) -> str:
    """What the operator asked of the API server, per job, by verb and resource (the client's excluded)."""
    counts: collections.Counter[str] = collections.Counter()
    for request in server.requests():
        if "kopf" not in request.headers.get("User-Agent", "") and "OpenAPI" not in request.headers.get(
            "User-Agent", ""
        ):
            continue  # the benchmark's own aiohttp client
        resource = request.resource.plural if request.resource else "-"
        sub = f"/{request.subresource}" if request.subresource else ""
        method = getattr(request.method, "value", request.method)
        counts[f"{method} {resource}{sub}"] += 1
    return ", ".join(f"{key} {n / jobs:.2f}" for key, n in counts.most_common())


async def run(jobs: int, concurrency: int, rate: float, namespace: str, workers: int, log_level: str) -> str:
    crd_dir = kuberay_crd_dir()
    server = ApiServer()
    server.start()
    for crd in [*crd_documents(crd_dir, KUBERAY_CRD_FILES), *crd_documents(PROJECT_CRD_DIR)]:
        await server.install_crd(crd)
    await server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    tmp = Path(tempfile.mkdtemp())
    kubeconfig = write_kubeconfig(server.url, tmp / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "LLMTRAIN_OPERATOR_WORKERS": str(workers)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmtrain.cli",
            "operator",
            "--namespace",
            namespace,
            "--liveness-port",
            "0",
            "--metrics-port",
            "0",
            "--log-level",
            log_level,
            "--log-format",
            "json",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "operator.log", "w"),  # noqa: SIM115
    )
    try:
        await asyncio.sleep(3)  # let Kopf start its watches
        created_at: dict[str, float] = {}
        rayjob_at: dict[str, float] = {}
        status_at: dict[str, float] = {}
        sem = asyncio.Semaphore(concurrency)

        async def create(i: int) -> None:
            name = f"bench-{i:05d}"
            doc = minimal_job(name, namespace)
            if rate:  # an offered load: job i is due at start + i / rate
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            async with sem:
                created_at[name] = time.monotonic()
                await server.create(doc)

        done = asyncio.Event()

        async def watch_rayjobs() -> None:
            async for event in server.watch(*RAYJOB, namespace):
                rayjob_at.setdefault(event["object"]["metadata"]["name"], time.monotonic())

        async def watch_jobs() -> None:
            async for event in server.watch(*JOB, namespace):
                obj = event["object"]
                if (obj.get("status") or {}).get("phase"):
                    status_at.setdefault(obj["metadata"]["name"], time.monotonic())
                    if len(status_at) == jobs:
                        done.set()

        watchers = [asyncio.create_task(watch_rayjobs()), asyncio.create_task(watch_jobs())]
        await asyncio.sleep(0.5)
        start = time.monotonic()
        creator = asyncio.gather(*(create(i) for i in range(jobs)))
        while not done.is_set():
            if creator.done() and creator.exception():
                raise creator.exception()  # type: ignore[misc]
            if proc.poll() is not None:
                raise SystemExit(f"the operator exited ({proc.returncode}); see {tmp / 'operator.log'}")
            if time.monotonic() - start > 900:
                raise SystemExit(f"timeout: {len(rayjob_at)} RayJobs, {len(status_at)} statuses after 900 s")
            await asyncio.sleep(0.2)
        for task in watchers:
            task.cancel()
        await creator
        total = max(status_at.values()) - start
        created_s = max(created_at.values()) - start
        latencies = sorted((rayjob_at[n] - created_at[n]) * 1000 for n in created_at)
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        rss = peak_rss_mb(proc.pid)
        print(f"operator requests per job: {requests_per_job(server, jobs)}", flush=True)
        print(
            f"client created all jobs in {created_s:.1f} s; operator: {jobs / total:.0f} jobs/s, "
            f"cpu_s={cpu_seconds(proc.pid):.1f} wall_s={total:.1f} "
            f"server+client cpu_s={time.process_time():.1f}",
            flush=True,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        await server.aclose()
    return f"jobs={jobs} total_s={total:.1f} p50_ms={p50:.0f} p99_ms={p99:.0f} rss_mb={rss:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20, help="parallel creates by the client")
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="jobs created per second (0: a burst, as fast as the API server takes them)",
    )
    parser.add_argument("--workers", type=int, default=16, help="operator handler threads")
    parser.add_argument("--namespace", default="bench")
    parser.add_argument(
        "--log-level", default="info", help="the operator's, as deployed by the chart (JSON logs to a file)"
    )
    args = parser.parse_args()
    load = f"{args.rate:g} jobs/s" if args.rate else f"a burst, client concurrency {args.concurrency}"
    print(f"creating {args.jobs} LLMTrainingJobs ({load}); operator threads {args.workers}", flush=True)
    print(
        asyncio.run(run(args.jobs, args.concurrency, args.rate, args.namespace, args.workers, args.log_level))
    )


if __name__ == "__main__":
    main()
