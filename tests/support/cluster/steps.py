"""The cluster tier's steps, shared by its tests (tests/cluster) and the operator benchmark
(benchmarks/operator_throughput.py): install the chart, start `llmtrain operator` as the chart's
ServiceAccount, apply and read objects, wait for a phase, end a Ray job as KubeRay would see it,
and check the API server's audit log. The pytest fixtures built on these stay in
tests/cluster/conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtrain.operator.permissions import granted

from tests.support.cluster import audit, nodes, processes
from tests.support.cluster import cluster as cluster_module
from tests.support.cluster.cluster import REPO_ROOT, Cluster, tools
from tests.support.jobs import minimal_job

PLATFORM_NAMESPACE = cluster_module.PLATFORM_NAMESPACE
RELEASE = "llmtrain"
OPERATOR_SA = "llmtrain-operator"
# Short, so that tests of the level-triggered resync need not wait the default 120 s.
RESYNC_SECONDS = 10
# A test finalizer: an object outlives its deletion for as long as a test holds it.
HOLD_FINALIZER = "llmtrain.dev/test-hold"
CHART = REPO_ROOT / "charts" / "llmtrain"
OPERATOR_USER = f"system:serviceaccount:{PLATFORM_NAMESPACE}:{OPERATOR_SA}"


def helm(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [cluster.bins["helm"], f"--kubeconfig={cluster.kubeconfig}", *args]
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(cluster.directory / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(cluster.directory / "helm" / "config"),
        "HELM_DATA_HOME": str(cluster.directory / "helm" / "data"),
    }
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr}")
    return result


@dataclass
class OperatorProcess:
    """`llmtrain operator` in its own process, logging to `log`; `restart` starts the same again."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    kubeconfig: Path
    proc: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self._spawn()

    def _spawn(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=REPO_ROOT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (graceful, as a rolling update does) or SIGKILL (a node lost, an OOM kill)."""
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, *, kill: bool = False) -> None:
        """The same operator identity in a new process, as after a pod restart."""
        self.stop(kill=kill)
        self._spawn()

    def start(self) -> None:
        """Start it again after `stop`."""
        assert self.proc.poll() is not None, "still running"
        self._spawn()


def start_operator(
    cluster: Cluster,
    directory: Path,
    name: str = "operator",
    *,
    log_format: str = "plain",
    log_level: str = "info",
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    resync_seconds: float = RESYNC_SECONDS,
    service_account: tuple[str, str] = (OPERATOR_SA, PLATFORM_NAMESPACE),
) -> OperatorProcess:
    """`llmtrain operator` for all namespaces as the chart's ServiceAccount (a TokenRequest token, no
    admin rights), so the real RBAC authorizer and API priority and fairness treat it as in a pod.
    `service_account` (name, namespace): another release's."""
    token = cluster.token(*service_account, duration="6h")
    kubeconfig = cluster.kubeconfig_for_token(directory / f"{name}.kubeconfig", token)
    full_env = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
    full_env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [
        sys.executable,
        "-m",
        "llmtrain.cli",
        "operator",
        f"--liveness-port={processes.free_port()}",
        f"--metrics-port={processes.free_port()}",
        f"--log-format={log_format}",
        f"--log-level={log_level}",
        f"--resync-seconds={resync_seconds}",
        *args,
    ]
    return OperatorProcess(argv, full_env, directory / f"{name}.log", kubeconfig)


def assert_only_declared_calls(cluster: Cluster, since: int = 0) -> list[audit.Call]:
    """From the API server's audit log: the operator made only the calls it declares, was refused
    none, and never used a right it holds only for an admission plugin's sake (e.g. `delete`)."""
    made = audit.calls(cluster.audit_log, OPERATOR_USER, since)
    undeclared = sorted({c.permission for c in made if not granted(*c.permission)})
    assert not undeclared, f"the operator made calls it does not declare: {undeclared}"
    refused = [c for c in made if not c.authorized]
    assert not refused, f"refused by RBAC: {refused[:10]}"
    return made


def assert_no_rbac_refusals(op: OperatorProcess) -> None:
    """RBAC's refusals name the user; a namespace being deleted also answers 403, to anyone."""
    forbidden = [
        line
        for line in op.output().splitlines()
        if "forbidden" in line.lower() and "system:serviceaccount:" in line
    ]
    assert not forbidden, "the operator was refused by RBAC:\n" + "\n".join(forbidden[:10])


def wait_for(
    check: Callable[[], Any], timeout: float = 60, interval: float = 0.5, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, KeyError, TypeError, IndexError) as e:
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


def get(cluster: Cluster, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    args = ["get", kind, name, "-o", "json"]
    if namespace:
        args += ["-n", namespace]
    result = cluster.kubectl(*args, check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr or "not found" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    obj: dict[str, Any] = json.loads(result.stdout)
    return obj


def items(cluster: Cluster, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", kind, "-n", namespace, "-o", "json"]
    if selector:
        args += ["-l", selector]
    listed: list[dict[str, Any]] = json.loads(cluster.kubectl(*args).stdout)["items"]
    return listed


def apply_doc(
    cluster: Cluster, doc: dict[str, Any], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply` of one document, as a user would (client-side, strict field validation).

    Sent as JSON: kubectl reads YAML 1.1, where a plain `y` or `no` is a boolean, so a value that is
    a string to PyYAML could reach the API server as another type."""
    return cluster.kubectl("apply", "--validate=strict", "-f", "-", input=json.dumps(doc), check=check)


def job_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    job = get(cluster, "llmtj", name, namespace) or {}
    status: dict[str, Any] = job.get("status") or {}
    return status


def wait_phase(
    cluster: Cluster, namespace: str, name: str, *phases: str, timeout: float = 90
) -> dict[str, Any]:
    """Wait until the job's phase is one of `phases`; its status then."""
    status: dict[str, Any] = wait_for(
        lambda: (s := job_status(cluster, namespace, name)).get("phase") in phases and s,
        timeout=timeout,
        what=f"{namespace}/{name} phase in {phases}",
    )
    return status


def end_ray_job(cluster: Cluster, namespace: str, rayjob: str, *, succeed: bool, message: str = "") -> None:
    """What a real Ray job ending looks like to KubeRay: the dashboard reports the Ray job's status
    and the submitter pod exits (0 or 1), both for every later attempt of this RayJob too."""
    body = json.dumps({"status": "SUCCEEDED" if succeed else "FAILED", "message": message}).encode()
    request = urllib.request.Request(
        f"{cluster.dashboard}/control/{namespace}/{rayjob}", data=body, method="PUT"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    cluster.apply(
        [nodes.pod_outcome_stage(tools.module_dir("kwok"), f"end-{namespace}", namespace, succeed=succeed)]
    )
    touch_job_pods(cluster, namespace)


def finish_job(
    cluster: Cluster, namespace: str, name: str, *, succeed: bool = True, message: str = ""
) -> None:
    """Run an applied job to its end: Running, then the Ray job ends (Succeeded, or Failed with
    `message`), the job's phase follows, and the outcome stage is cleared for later jobs."""
    wait_phase(cluster, namespace, name, "Running")
    try:
        end_ray_job(cluster, namespace, name, succeed=succeed, message=message)
        wait_phase(cluster, namespace, name, "Succeeded" if succeed else "Failed")
    finally:
        clear_outcome(cluster, namespace)


def fail_submitter(cluster: Cluster, namespace: str) -> None:
    """The submitter pod exits 1 before the Ray job reports anything (e.g. the image fails)."""
    cluster.apply(
        [nodes.pod_outcome_stage(tools.module_dir("kwok"), f"fail-{namespace}", namespace, succeed=False)]
    )
    touch_job_pods(cluster, namespace)


def clear_outcome(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "delete", "stages.kwok.x-k8s.io", f"end-{namespace}", f"fail-{namespace}", "--ignore-not-found"
    )


class Watch:
    """Every version of one kind's objects in a namespace, as `kubectl get --watch` streams them.

    An invariant checked on these holds for every write, which polling cannot promise: a field
    flipped and flipped back between two polls shows up here. Use as a context manager; it returns
    once the watch is established, so nothing written after that is missed.
    """

    def __init__(self, cluster: Cluster, kind: str, namespace: str) -> None:
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._established = threading.Event()
        self._proc = subprocess.Popen(
            [
                cluster.bins["kubectl"],
                f"--kubeconfig={cluster.kubeconfig}",
                "get",
                kind,
                "-n",
                namespace,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
                "-v=6",  # logs the watch request's response: the signal that it is established
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_events(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.strip():
                event = json.loads(line)
                with self._lock:
                    self._events.append(event)

    def _read_log(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            if "watch=true" in line and 'status="200' in line:
                self._established.set()

    def __enter__(self) -> Watch:
        if not self._established.wait(30):
            self.stop()
            raise AssertionError("kubectl --watch did not establish its watch in 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=10)

    def names(self) -> set[str]:
        """Every object seen so far, by name (those deleted since included)."""
        with self._lock:
            return {e["object"]["metadata"]["name"] for e in self._events}

    def versions(self, name: str) -> list[dict[str, Any]]:
        """The object's states in the order the API server stored them (DELETED events left out)."""
        with self._lock:
            return [
                e["object"]
                for e in self._events
                if e["type"] != "DELETED" and e["object"]["metadata"]["name"] == name
            ]


def touch_job_pods(cluster: Cluster, namespace: str) -> None:
    """kwok matches a Stage against a pod only on the pod's next event, so an outcome Stage
    (end_ray_job, fail_submitter) applied after the submitter pod started needs this nudge."""
    cluster.kubectl(
        "annotate",
        "pods",
        "-n",
        namespace,
        "-l",
        "batch.kubernetes.io/job-name",
        f"llmtrain.dev/test-touched={time.monotonic_ns()}",
        "--overwrite",
    )


def patch_status(cluster: Cluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    """A merge patch of the job's status subresource."""
    cluster.kubectl(
        "patch",
        "llmtj",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def set_progress(cluster: Cluster, namespace: str, name: str, progress: dict[str, Any]) -> None:
    """What the trainer's rank 0 patches (status subresource, merge patch)."""
    patch_status(cluster, namespace, name, {"progress": progress})


def table(text: str) -> list[dict[str, str]]:
    """kubectl's table output as rows keyed by column name; cells are cut at the header's column
    starts, so a cell holding spaces (a message) stays whole and an empty one reads ''."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    names = header.split()
    return [
        {name: line[a:b].strip() for name, a, b in zip(names, starts, ends, strict=True)}
        for line in lines[1:]
    ]


def delete_jobs(cluster: Cluster, namespace: str) -> None:
    """Jobs and their RayJobs go before their namespace does, so the operator does not keep
    reporting on jobs into a namespace that refuses new Events (and their GPUs are free again)."""
    cluster.kubectl("delete", "llmtj", "--all", "-n", namespace, "--wait=true")
    wait_for(lambda: not items(cluster, "rayjobs", namespace), what=f"the RayJobs of {namespace} gone")


def cpu_job(
    name: str,
    namespace: str,
    *,
    suspend: bool = False,
    workers: int = 1,
    reclaim: str = "Delete",
    **spec: Any,
) -> dict[str, Any]:
    """A small CPU job on a provisioned claim; suspended ones get their identity (ServiceAccount,
    Role) but no Ray cluster. The claim goes with the job (`reclaim: Delete`, not the default
    Retain), so every child is owned and a namespace's claims do not pile up."""
    resources = {
        "workers": workers,
        "gpusPerWorker": 0,
        "cpu": "1",
        "memory": "2Gi",
        "sharedMemory": "1Gi",
        "head": {"cpu": "1", "memory": "2Gi"},
    }
    return minimal_job(
        name,
        namespace,
        resources=resources,
        storage={"create": {"size": "1Gi", "storageClassName": "shared-rwx", "reclaim": reclaim}},
        runPolicy={"suspend": suspend},
        **spec,
    )
