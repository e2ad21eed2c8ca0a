"""Operator throughput: N LLMTrainingJobs created in a real control plane (tests/support/cluster:
etcd, kube-apiserver with RBAC and admission, KubeRay, Kueue) with the chart installed by Helm; time
until every one has its RayJob and a status, create→RayJob latency percentiles, the operator
process's peak RSS, and what it asked of the API server per job (from the server's audit log).

The operator runs as `llmtrain operator` in its own process, authenticated as the chart's
ServiceAccount, as the cluster tests run it. Last line: `jobs=… total_s=… p50_ms=… p99_ms=… rss_mb=…`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO)]  # this tree's operator, here and in the operator process
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, (str(REPO / "operator"), os.environ.get("PYTHONPATH")))
)

from llmtrain.constants import FINISHED_LABEL, GROUP_VERSION, PLURAL, RAY_GROUP_VERSION, RAYJOB_PLURAL  # noqa: E402
from llmtrain.operator.config import DEFAULT_RESYNC_SECONDS  # noqa: E402

from tests.support.cluster import audit, processes  # noqa: E402
from tests.support.cluster.cluster import Cluster  # noqa: E402
from tests.support.cluster.steps import (  # noqa: E402
    CHART,
    OPERATOR_USER,
    PLATFORM_NAMESPACE,
    RELEASE,
    helm,
    start_operator,
)
from tests.support.jobs import minimal_job  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set size."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentiles(created_at: dict[str, float], rayjob_at: dict[str, float]) -> tuple[float, float]:
    """p50 and p99 of create→RayJob, in ms."""
    latencies = sorted((rayjob_at[n] - created_at[n]) * 1000 for n in created_at)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return statistics.median(latencies), p99


async def all_statuses(
    done: asyncio.Event,
    creator: asyncio.Future[Any],
    proc: subprocess.Popen[bytes],
    log: Path,
    start: float,
    rayjob_at: dict[str, float],
    status_at: dict[str, float],
    watchers: list[asyncio.Task[None]],
) -> None:
    """Until every job has a status; fails fast if the client, a watch or the operator dies, or
    after 900 s."""
    while not done.is_set():
        if creator.done() and creator.exception():
            raise creator.exception()  # type: ignore[misc]
        for task in watchers:
            if task.done():
                raise SystemExit(f"the benchmark's watch ended: {task.exception()!r}")
        if proc.poll() is not None:
            raise SystemExit(f"the operator exited ({proc.returncode}); see {log}")
        if time.monotonic() - start > 900:
            raise SystemExit(f"timeout: {len(rayjob_at)} RayJobs, {len(status_at)} statuses after 900 s")
        await asyncio.sleep(0.2)


# Prometheus series of kube-apiserver read before and after the run, by the short name used below.
SERVER_METRICS = {
    "apiserver_request_total": "requests",
    "apiserver_request_duration_seconds_sum": "seconds",
    "apiserver_request_duration_seconds_count": "timed",
    "apiserver_admission_webhook_admission_duration_seconds_sum": "webhook_seconds",
    "apiserver_admission_webhook_admission_duration_seconds_count": "webhook_calls",
    "apiserver_flowcontrol_request_wait_duration_seconds_sum": "apf_wait_seconds",
    "apiserver_flowcontrol_request_wait_duration_seconds_count": "apf_waited",
    "apiserver_flowcontrol_rejected_requests_total": "apf_rejected",
}
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# The cluster's processes whose CPU time is reported (pid files under <cluster dir>/pids/).
COMPONENTS = ("kube-apiserver", "etcd", "kuberay", "kueue", "kube-controller-manager", "kwok")


class RealApi:
    """The benchmark's own client of the real API server: admin certificate, JSON over aiohttp."""

    def __init__(self, cluster: Cluster) -> None:
        import aiohttp

        pki = cluster.directory / "pki"
        tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.session = aiohttp.ClientSession(
            base_url=cluster.server,
            connector=aiohttp.TCPConnector(ssl=tls, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )

    async def create(self, path: str, doc: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(path, json=doc) as response:
            if response.status >= 300:
                raise SystemExit(f"POST {path}: {response.status} {await response.text()}")
            created: dict[str, Any] = await response.json()
            return created

    async def patch_status(self, path: str, status: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(f"{path}/status", json={"status": status}, headers=headers) as response:
            if response.status >= 300:
                raise SystemExit(f"PATCH {path}/status: {response.status} {await response.text()}")

    async def any_listed(self, path: str, label_selector: str) -> bool:
        """Whether a LIST with `label_selector` has any item (one asked for)."""
        params = {"labelSelector": label_selector, "limit": "1"}
        async with self.session.get(path, params=params) as response:
            return bool((await response.json()).get("items"))

    async def exists(self, path: str) -> bool:
        async with self.session.get(path) as response:
            return response.status == 200

    async def watch(self, path: str, on_event: Callable[[dict[str, Any]], None]) -> None:
        """Calls on_event for each event of a watch from now on (one JSON object per line). The API
        server ends a watch at its timeout, and its watch cache drops a watcher that falls behind
        (this client, niced, under a burst's thousands of events): watched again from the last
        resourceVersion seen, or after a 410 Gone from a fresh LIST (each item as an ADDED event).
        Before this a burst's run could stop seeing statuses and wait to its timeout."""
        import aiohttp

        version = ""
        while True:
            if not version:
                async with self.session.get(path) as response:
                    listed = await response.json()
                for item in listed.get("items") or ():
                    on_event({"type": "ADDED", "object": item})
                version = listed["metadata"]["resourceVersion"]
            params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
            try:
                async with self.session.get(path, params=params) as response:
                    buffer = b""
                    async for chunk in response.content.iter_any():
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            if event["type"] == "ERROR":  # 410 Gone: too far behind to resume
                                version = ""
                                break
                            version = event["object"]["metadata"]["resourceVersion"]
                            if event["type"] != "BOOKMARK":
                                on_event(event)
                        if not version:
                            break
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                await asyncio.sleep(0.5)

    async def metrics(self) -> dict[str, float]:
        """The API server's own counters, all clients together: requests and their seconds by verb and
        resource, admission webhook calls and seconds, seconds queued by API priority and fairness."""
        async with self.session.get("/metrics") as response:
            text = await response.text()
        totals: dict[str, float] = collections.defaultdict(float)
        for line in text.splitlines():
            name, _, rest = line.partition("{")
            if name not in SERVER_METRICS or "} " not in rest:
                continue
            labels_text, value = rest.rsplit("} ", 1)
            labels = dict(LABEL.findall(labels_text))
            if name.startswith("apiserver_request_"):
                if not labels.get("resource"):
                    continue
                sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
                code = "" if labels.get("code", "2").startswith("2") else f" {labels['code']}"
                key = f"{labels['verb']} {labels['resource']}{sub}"
                key += code if name == "apiserver_request_total" else ""
            elif name.startswith("apiserver_admission_webhook"):
                key = f"{labels['name']} {labels['operation']}"
            else:
                key = labels.get("priority_level", "")
            totals[f"{SERVER_METRICS[name]}|{key}"] += float(value)
        return dict(totals)

    async def aclose(self) -> None:
        await self.session.close()


def start_cluster(directory: Path | None, with_kueue: bool) -> tuple[Cluster, Callable[[], None]]:
    """The running cluster recorded in `directory` (`make cluster`'s), or a new one in a temp dir."""
    if directory is not None:
        return Cluster.load(directory.resolve()), lambda: None
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    started = time.monotonic()
    cluster = Cluster.up(tmp, with_kueue=with_kueue)
    print(f"cluster up in {time.monotonic() - started:.0f} s ({tmp})", flush=True)

    def down() -> None:
        Cluster.down(tmp)
        shutil.rmtree(tmp, ignore_errors=True)

    return cluster, down


def install_chart(cluster: Cluster) -> None:
    """`helm install` of charts/llmtrain, as the cluster tests' `platform` fixture does, with its
    operator Deployment scaled to none: on `make cluster`'s real node its pod really runs, and a
    second operator (the same ServiceAccount in the audit log) would race the measured one."""
    if helm(cluster, "status", RELEASE, "-n", PLATFORM_NAMESPACE, check=False).returncode != 0:
        helm(cluster, "install", RELEASE, str(CHART), "-n", PLATFORM_NAMESPACE, "--create-namespace")
    cluster.kubectl("scale", "deployment", "--all", "--replicas=0", "-n", PLATFORM_NAMESPACE)


def bench_job(name: str, namespace: str, suspended: bool) -> dict[str, Any]:
    doc = minimal_job(name, namespace)
    if suspended:
        doc["spec"]["runPolicy"] = {"suspend": True}
    return doc


def requests_per_job(cluster: Cluster, since: int, jobs: int) -> str:
    """What the operator asked of the API server, per job, by verb and resource (its audit trail)."""
    counts = collections.Counter(
        f"{call.verb} {call.resource}" for call in audit.calls(cluster.audit_log, OPERATOR_USER, since)
    )
    return ", ".join(f"{key} {n / jobs:.2f}" for key, n in counts.most_common())


async def ceiling(
    api: RealApi,
    kubeconfig: Path,
    namespace: str,
    args: argparse.Namespace,
    suspended: bool,
) -> tuple[float, float, float]:
    """The ceiling the operator is measured against: the same jobs created the same way (this
    client, admin, at `--concurrency` or `--rate`), and for each, once it is stored, the objects the
    operator creates for it (`render`'s output, owned by the job) created in order by a plain
    client: the operator's own API layer (`Kube`, the kubernetes client) with the operator's
    ServiceAccount token, `--workers` jobs at a time, as many as the operator's handler threads.
    It does no reading, no status and no watching. The namespace's reporter Role and RoleBinding
    are created once, first, as the operator does on a namespace's first job. Returns jobs/s to the
    last RayJob, and p50 and p99 of create→RayJob in ms. Run with the operator stopped."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from llmtrain.api.validation import parse_job
    from llmtrain.operator.kube import Kube
    from llmtrain.render import render
    from llmtrain.render.rbac import render_reporter_rbac

    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = args.workers  # as `Kube.from_environment` sizes it
    kube = Kube(k8s_client.ApiClient(configuration))
    group = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{PLURAL}"
    pool = ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="ceiling")
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(args.concurrency)
    created_at: dict[str, float] = {}
    rayjob_at: dict[str, float] = {}

    def children(doc: dict[str, Any]) -> None:
        for obj in render(parse_job(doc)):
            kube.create(obj)
        rayjob_at[doc["metadata"]["name"]] = time.monotonic()

    for obj in render_reporter_rbac(namespace):
        kube.create(obj)
    start = time.monotonic()

    async def one(i: int) -> None:
        name = f"ceil-{i:05d}"
        if args.rate:
            await asyncio.sleep(max(0.0, start + i / args.rate - time.monotonic()))
        doc = bench_job(name, namespace, suspended)
        async with sem:
            created_at[name] = time.monotonic()
            stored = await api.create(group, doc)
        await loop.run_in_executor(pool, children, {**doc, "metadata": stored["metadata"]})

    try:
        await asyncio.gather(*(one(i) for i in range(args.jobs)))
    finally:
        pool.shutdown()
    total = max(rayjob_at.values()) - start
    p50, p99 = percentiles(created_at, rayjob_at)
    return args.jobs / total, p50, p99


async def run(args: argparse.Namespace) -> str:
    jobs, rate, suspended = args.jobs, args.rate, not args.kuberay_runs
    cluster, down = start_cluster(args.cluster_dir, with_kueue=not args.no_kueue)
    tmp = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    namespace = f"{args.namespace}-{int(time.time())}"  # a reused cluster keeps earlier runs' jobs
    proc: subprocess.Popen[bytes] | None = None
    api = RealApi(cluster)
    try:
        install_chart(cluster)
        kueue = f", Kueue {cluster.kueue_version}" if "kueue" in processes.running(cluster.directory) else ""
        print(
            f"real cluster: Kubernetes {cluster.kubernetes_version}, "
            f"KubeRay {cluster.kuberay_version}{kueue}; "
            + (
                "jobs created with spec.runPolicy.suspend=true: KubeRay only adds its finalizer and marks "
                "each RayJob Suspended (no RayCluster, no pods), so its load stays out of the measurement"
                if suspended
                else "RayJobs run: KubeRay creates a RayCluster and pods per job (on the same CPUs)"
            ),
            flush=True,
        )
        for ns in (namespace, f"{namespace}-warmup"):
            cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
        operator = start_operator(
            cluster,
            tmp,
            log_format="json",
            log_level=args.log_level,
            args=("--workers", str(args.workers)),
            resync_seconds=DEFAULT_RESYNC_SECONDS,  # as deployed
        )
        proc = operator.proc
        # Warm-up: one job elsewhere until its RayJob exists, so the operator is watching and authorized.
        group = f"/apis/{GROUP_VERSION}/namespaces"
        ray = f"/apis/{RAY_GROUP_VERSION}/namespaces"
        await api.create(
            f"{group}/{namespace}-warmup/{PLURAL}",
            bench_job("warmup", f"{namespace}-warmup", suspended),
        )
        deadline = time.monotonic() + 120
        while not await api.exists(f"{ray}/{namespace}-warmup/{RAYJOB_PLURAL}/warmup"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the operator did not start; see {tmp / 'operator.log'}")
            await asyncio.sleep(0.2)

        created_at: dict[str, float] = {}
        rayjob_at: dict[str, float] = {}
        status_at: dict[str, float] = {}
        phases: dict[str, str] = {}
        settle_phase = "Suspended" if suspended else "Running"
        settled_at: dict[str, float] = {}
        done = asyncio.Event()

        def on_rayjob(event: dict[str, Any]) -> None:
            rayjob_at.setdefault(event["object"]["metadata"]["name"], time.monotonic())

        def on_job(event: dict[str, Any]) -> None:
            obj = event["object"]
            name, phase = obj["metadata"]["name"], (obj.get("status") or {}).get("phase")
            if phase:
                status_at.setdefault(name, time.monotonic())
                phases[name] = phase
                if phase == settle_phase:
                    settled_at.setdefault(name, time.monotonic())
                if len(status_at) == jobs:
                    done.set()

        watchers = [
            asyncio.create_task(api.watch(f"{ray}/{namespace}/{RAYJOB_PLURAL}", on_rayjob)),
            asyncio.create_task(api.watch(f"{group}/{namespace}/{PLURAL}", on_job)),
        ]
        await asyncio.sleep(1)
        cpu_before = {name: cpu_seconds(pid) for name, pid in processes.running(cluster.directory).items()}
        cpu_before["operator"] = cpu_seconds(proc.pid)
        requests_before = await api.metrics()
        audit_mark = audit.size(cluster.audit_log)
        sem = asyncio.Semaphore(args.concurrency)
        start = time.monotonic()

        async def create(i: int) -> None:
            name = f"bench-{i:05d}"
            if rate:  # an offered load: job i is due at start + i / rate
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            async with sem:
                created_at[name] = time.monotonic()
                await api.create(f"{group}/{namespace}/{PLURAL}", bench_job(name, namespace, suspended))

        creator = asyncio.gather(*(create(i) for i in range(jobs)))
        await all_statuses(done, creator, proc, tmp / "operator.log", start, rayjob_at, status_at, watchers)
        await creator
        total = max(status_at.values()) - start
        created_s = max(created_at.values()) - start
        p50, p99 = percentiles(created_at, rayjob_at)
        rss = peak_rss_mb(proc.pid)
        cpu = {
            name: cpu_seconds(pid) - cpu_before.get(name, 0.0)
            for name, pid in processes.running(cluster.directory).items()
        }
        cpu["operator"] = cpu_seconds(proc.pid) - cpu_before["operator"]
        requests = {key: n - requests_before.get(key, 0.0) for key, n in (await api.metrics()).items()}
        # KubeRay's Suspended (or Running) comes after the first status: the mirror keeps up with it?
        settle_deadline = time.monotonic() + 60
        while len(settled_at) < jobs and time.monotonic() < settle_deadline:
            await asyncio.sleep(0.5)
        for task in watchers:
            task.cancel()
        print(server_report(requests, jobs))
        print(f"operator requests per job: {requests_per_job(cluster, audit_mark, jobs)}")
        used = ", ".join(f"{name}={cpu[name]:.1f}" for name in ("operator", *COMPONENTS) if name in cpu)
        print(
            f"cpu_s from the first create to the last status: {used}; "
            f"this client={time.process_time():.1f} (whole run)"
        )
        settled = max(settled_at.values()) - start if len(settled_at) == jobs else float("nan")
        print(
            f"client created all jobs in {created_s:.1f} s; operator: {jobs / total:.0f} jobs/s, "
            f"cpu_s={cpu['operator']:.1f} wall_s={total:.1f}; {len(settled_at)}/{jobs} jobs "
            f"{settle_phase} (all at {settled:.1f} s); phases: {dict(collections.Counter(phases.values()))}",
            flush=True,
        )
        op_rate = jobs / (max(rayjob_at.values()) - start)
        result = f"jobs={jobs} total_s={total:.1f} p50_ms={p50:.0f} p99_ms={p99:.0f} rss_mb={rss:.0f}"
        if not args.no_ceiling:
            proc.terminate()  # the ceiling's jobs are for the plain client alone
            proc.wait(timeout=30)
            print(
                f"operator: {op_rate:.1f} jobs/s to the last RayJob, "
                f"create→RayJob p50/p99 {p50:.0f}/{p99:.0f} ms"
            )
            ns = f"{namespace}-ceiling"
            cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
            rate, c50, c99 = await ceiling(api, operator.kubeconfig, ns, args, suspended)
            print(
                f"plain client, every object render yields: {rate:.1f} jobs/s, create→RayJob p50/p99 "
                f"{c50:.0f}/{c99:.0f} ms; operator/this = {op_rate / rate:.2f}",
                flush=True,
            )
            result += f" ceiling_ratio={op_rate / rate:.2f} ceiling_p99_ms={c99:.0f}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        await api.aclose()
        if args.cluster_dir is not None:
            spaces = [namespace, f"{namespace}-warmup", f"{namespace}-ceiling"]
            cluster.kubectl("delete", "namespace", *spaces, "--wait=false", "--ignore-not-found", check=False)
            # Gone before the next run's operator starts: it would reconcile the ceiling's jobs
            # (no status) in namespaces being terminated, and its figures would count that work.
            cluster.kubectl(
                "wait",
                "--for=delete",
                *(f"namespace/{ns}" for ns in spaces),
                "--timeout=600s",
                check=False,
                timeout=620,
            )
        down()
    return result


def finished_status(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """A status as a job that ran to its end carries it: the operator's fields and conditions, the
    trainer's last progress, and Kopf's diff base (a copy of the spec, status.kopf.lastHandled)."""
    at = "2026-11-26T10:00:00Z"
    conditions = [
        {"type": kind, "status": value, "reason": reason, "message": message, "lastTransitionTime": at}
        for kind, value, reason, message in (
            ("Created", "True", "RayJobCreated", f"RayJob {name} created"),
            ("Running", "False", "Completed", "the run ended"),
            ("Succeeded", "True", "Completed", "the training application succeeded"),
            ("Failed", "False", "Completed", "the run succeeded"),
            ("Suspended", "False", "Completed", "not suspended"),
        )
    ]
    return {
        "phase": "Succeeded",
        "reason": "Completed",
        "message": "the training application succeeded",
        "rayJobName": name,
        "rayClusterName": f"{name}-raycluster-x7k2p",
        "observedGeneration": 1,
        "startTime": at,
        "completionTime": at,
        "retries": 0,
        "conditions": conditions,
        "progress": {"step": 1000, "totalSteps": 1000, "loss": 1.234, "checkpoint": "step-1000", "at": at},
        "kopf": {"lastHandled": json.dumps({"spec": doc["spec"], "metadata": {"labels": {}}})},
    }


# A finished RayJob's status as KubeRay leaves it.
RAYJOB_SUCCEEDED = {
    "jobDeploymentStatus": "Complete",
    "jobStatus": "SUCCEEDED",
    "startTime": "2026-11-26T09:00:00Z",
    "endTime": "2026-11-26T10:00:00Z",
}


async def retained(api: RealApi, namespace: str, count: int, concurrency: int) -> None:
    """`count` jobs that ran to their end, as kept after they finished: each job with a terminal
    status, and its RayJob (rendered as the operator renders it, owned by the job) kept too, but
    created suspended so KubeRay makes no cluster for it, with the status KubeRay leaves on a
    finished RayJob (a suspended RayJob without one would be mirrored as a job that has not
    started). Made by this client, not the operator: the operator then starts on them as after an
    upgrade or a restart."""
    from llmtrain.api.validation import parse_job
    from llmtrain.render import render

    group = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{PLURAL}"
    ray = f"/apis/{RAY_GROUP_VERSION}/namespaces/{namespace}/{RAYJOB_PLURAL}"
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        name = f"done-{i:05d}"
        doc = minimal_job(name, namespace)
        async with sem:
            stored = await api.create(group, doc)
            await api.patch_status(f"{group}/{name}", finished_status(doc, name))
            meta = {**doc["metadata"], "uid": stored["metadata"]["uid"]}
            rayjob = render(parse_job({**doc, "metadata": meta}))[-1]
            rayjob["spec"]["suspend"] = True
            await api.create(ray, rayjob)
            await api.patch_status(f"{ray}/{name}", RAYJOB_SUCCEEDED)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    print(f"{count} finished jobs and their RayJobs made in {time.monotonic() - started:.0f} s", flush=True)


async def idle(pid: int, cap_s: float) -> float:
    """Seconds until the process uses under 5% of a core over 5 s (at most `cap_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < cap_s:
        before = cpu_seconds(pid)
        await asyncio.sleep(5)
        if cpu_seconds(pid) - before < 0.25:
            break
    return time.monotonic() - started


async def all_labelled(api: RealApi, jobs: str, started: float) -> float:
    """Seconds from `started` until no job lacks the finished label (polled each 0.5 s)."""
    while await api.any_listed(jobs, f"!{FINISHED_LABEL}"):
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def run_retained(args: argparse.Namespace) -> str:
    """Peak RSS of an operator started beside `args.retained` finished jobs, over two resync
    periods and until it is idle: first as after an upgrade (the jobs not yet labelled finished),
    then restarted (steady state)."""
    cluster, down = start_cluster(args.cluster_dir, with_kueue=not args.no_kueue)
    tmp = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    namespace = f"{args.namespace}-{int(time.time())}"
    api = RealApi(cluster)
    results: list[str] = []
    try:
        install_chart(cluster)
        cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
        await retained(api, namespace, args.retained, args.concurrency)
        for run_name in ("first-start", "restart"):
            operator = start_operator(
                cluster,
                tmp,
                f"operator-{run_name}",
                log_format="json",
                log_level=args.log_level,
                args=("--workers", str(args.workers)),
                resync_seconds=args.resync_seconds,
            )
            proc = operator.proc
            try:
                started = time.monotonic()
                jobs = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{PLURAL}"
                labelled = asyncio.create_task(all_labelled(api, jobs, started))
                await asyncio.sleep(2 * args.resync_seconds + 2)
                settle = await idle(proc.pid, 600)
                if proc.poll() is not None:
                    raise SystemExit(f"the operator exited ({proc.returncode}); see {tmp}")
                # The first start labels every job finished; the restart is the steady state only
                # once it has (an operator stopped at a lull leaves the rest to the restart).
                while await api.any_listed(jobs, f"!{FINISHED_LABEL}") and time.monotonic() - started < 900:
                    await asyncio.sleep(5)
                rss = peak_rss_mb(proc.pid)
                wall = time.monotonic() - started
                await asyncio.sleep(1)  # the poll's last answer
                label_s = f"{labelled.result():.1f} s" if labelled.done() else "not yet"
                labelled.cancel()
                print(
                    f"{run_name}: peak RSS {rss:.0f} MB over {wall:.0f} s "
                    f"(two resync periods of {args.resync_seconds:g} s, then {settle:.0f} s until idle); "
                    f"operator cpu_s={cpu_seconds(proc.pid):.1f}; every job labelled finished "
                    f"{label_s} after the operator started",
                    flush=True,
                )
                results.append(f"{run_name}_rss_mb={rss:.0f}")
            finally:
                operator.stop()
    finally:
        await api.aclose()
        if args.cluster_dir is not None:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        down()
    return f"retained={args.retained} rss_mb={max(float(r.split('=')[1]) for r in results):.0f} " + " ".join(
        results
    )


def server_report(delta: dict[str, float], jobs: int) -> str:
    """What the API server did during the run, from its metrics (every client, not only the operator)."""

    def part(kind: str) -> dict[str, float]:
        return {key.split("|", 1)[1]: v for key, v in delta.items() if key.startswith(kind + "|") and v > 0}

    requests, seconds, timed = part("requests"), part("seconds"), part("timed")
    per_job = ", ".join(
        f"{key} {n / jobs:.2f}"
        for key, n in sorted(requests.items(), key=lambda kv: -kv[1])
        if n / jobs >= 0.05
    )
    latency = ", ".join(
        f"{key} {1000 * seconds[key] / n:.0f}"
        for key, n in sorted(timed.items(), key=lambda kv: -kv[1])
        if n / jobs >= 0.5 and not key.startswith("WATCH")
    )
    hooks, hook_s = part("webhook_calls"), part("webhook_seconds")
    webhooks = ", ".join(
        f"{key} {1000 * hook_s.get(key, 0) / n:.0f} ms x{n / jobs:.2f}" for key, n in hooks.items()
    )
    waits, wait_s = part("apf_waited"), part("apf_wait_seconds")
    queued = ", ".join(
        f"{lvl} {1000 * wait_s.get(lvl, 0) / n:.1f} ms" for lvl, n in waits.items() if n >= jobs
    )
    rejected = int(sum(part("apf_rejected").values()))
    return (
        "API server, every client (operator, KubeRay, Kueue, controllers, this one), per job: "
        f"{per_job}\nAPI server time per request, mean ms (server side): {latency}"
        f"\nadmission webhooks per job: {webhooks or 'none'}"
        f"\npriority-and-fairness queueing, mean: {queued or '-'}; rejected: {rejected}"
    )


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
        "--no-ceiling",
        action="store_true",
        help="skip the plain client's run (the ceiling) after the operator's",
    )
    parser.add_argument(
        "--log-level", default="info", help="the operator's, as deployed by the chart (JSON logs to a file)"
    )
    real = parser.add_argument_group("cluster")
    real.add_argument(
        "--cluster-dir",
        type=Path,
        help="the cluster running from this directory (e.g. `make cluster`'s .cluster), not a new one",
    )
    real.add_argument(
        "--kuberay-runs",
        action="store_true",
        help="let KubeRay run every RayJob (RayClusters, pods); default: jobs are created suspended",
    )
    real.add_argument(
        "--no-kueue", action="store_true", help="a new cluster without Kueue (and its webhooks)"
    )
    parser.add_argument(
        "--retained",
        type=int,
        default=0,
        help="instead: this many finished jobs kept, and the operator's peak RSS beside them "
        "(last line: retained=… rss_mb=…)",
    )
    parser.add_argument(
        "--resync-seconds", type=float, default=20, help="the operator's resync period with --retained"
    )
    args = parser.parse_args()
    if args.retained:
        print(f"{args.retained} finished jobs kept; operator threads {args.workers}", flush=True)
        print(asyncio.run(run_retained(args)))
        return
    load = f"{args.rate:g} jobs/s" if args.rate else f"a burst, client concurrency {args.concurrency}"
    print(f"creating {args.jobs} LLMTrainingJobs ({load}); operator threads {args.workers}", flush=True)
    print(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
