"""Injected API faults on the real API server: the emulator's fault scenarios, with the real control
plane, RBAC, KubeRay and garbage collector around the operator.

The operator talks to the API server through `FaultProxy` (tests/support/cluster/fault_proxy.py), which
fails or slows the requests a test names. This module runs on its own cluster: the session operator
(conftest `operator`) watches every namespace of the session cluster, and two operators on one job
would each mask the other's faults. Kopf's namespace globs cannot exclude a namespace from it either:
the operator disables Kopf's namespace scanning (settings.scanning.disabled), so a pattern such as
`!t-fault-*` is taken as no namespace at all, and the chart grants no list/watch on namespaces.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.render import render

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.fault_proxy import FaultProxy
from tests.support.cluster.steps import (
    CHART,
    PLATFORM_NAMESPACE,
    RELEASE,
    RESYNC_SECONDS,
    OperatorProcess,
    Watch,
    apply_doc,
    assert_no_rbac_refusals,
    clear_outcome,
    end_ray_job,
    get,
    helm,
    items,
    job_status,
    start_operator,
    wait_for,
    wait_phase,
)
from tests.support.jobs import minimal_job

CHILDREN = ["serviceaccount", "persistentvolumeclaim", "configmap", "rayjob"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """This module's own cluster (overrides the session's; see the module doc). No Kueue: no
    scenario here queues a job, and its webhooks would only add load."""
    directory = tmp_path_factory.mktemp("fault-cluster")
    c = Cluster.up(directory, with_kueue=False)
    try:
        yield c
    finally:
        Cluster.down(directory)


@pytest.fixture(scope="module")
def platform(cluster: Cluster) -> str:
    """The chart installed as in conftest, into this module's cluster (overrides the session's)."""
    helm(cluster, "install", RELEASE, str(CHART), "-n", PLATFORM_NAMESPACE, "--create-namespace")
    return PLATFORM_NAMESPACE


@pytest.fixture(scope="module")
def proxy(cluster: Cluster) -> Iterator[FaultProxy]:
    with FaultProxy(cluster) as p:
        yield p


@pytest.fixture(scope="module")
def proxied_operator(
    cluster: Cluster, platform: str, proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """`llmtrain operator` as the chart's ServiceAccount (all namespaces, as the chart deploys it),
    with every request through the proxy: its token passes through, so RBAC still judges it."""
    op = start_operator(
        dataclasses.replace(cluster, server=proxy.url), tmp_path_factory.mktemp("fault-operator")
    )
    _wait_watching(proxy, op, since=0)
    try:
        yield op
    finally:
        op.stop()
        assert_no_rbac_refusals(op)


@pytest.fixture
def faults(proxy: FaultProxy, proxied_operator: OperatorProcess) -> Iterator[FaultProxy]:
    """The proxy with no rules before and after the test."""
    proxy.clear()
    yield proxy
    proxy.clear()


def _wait_watching(proxy: FaultProxy, op: OperatorProcess, since: int) -> None:
    """Until the operator (re)opened its watches: a job created earlier would only be seen on resume."""

    def watching() -> bool:
        assert op.proc.poll() is None, op.output()[-3000:]
        opened = {(r.verb, r.resource) for r in proxy.requests[since:] if r.status == 200}
        return {("watch", "llmtrainingjobs"), ("watch", "rayjobs")} <= opened

    wait_for(watching, timeout=60, what="the operator's watches through the proxy")


def _job(name: str, namespace: str) -> dict[str, Any]:
    doc = minimal_job(name, namespace)
    doc["spec"]["storage"] = {"create": {"size": "1Gi"}}
    return doc


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def _job_events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str]]:
    """The job's own Events as (reason, message), oldest first, once the Running transition's was
    posted (Kopf posts asynchronously). Each phase transition is announced once: by the reconciler's
    first status write ("Created") or by the mirror ("RayJobCreated", "Training"...), whichever wrote."""

    def events() -> list[tuple[str, str]]:
        own = [
            e
            for e in items(cluster, "events", namespace)
            if e["involvedObject"]["kind"] == "LLMTrainingJob" and e["involvedObject"]["name"] == name
        ]
        own.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return [(e["reason"], e["message"]) for e in own]

    wait_for(
        lambda: any(reason == "Training" for reason, _ in events()),
        timeout=30,
        what=f"the Running transition's Event on {name}",
    )
    time.sleep(1)  # a duplicate would follow within Kopf's posting batch
    return events()


def _assert_each_transition_announced_once(cluster: Cluster, namespace: str, name: str) -> None:
    events = _job_events(cluster, namespace, name)
    reasons = [reason for reason, _ in events]
    assert len(reasons) == len(set(reasons)), events
    assert reasons.count("Created") + reasons.count("RayJobCreated") <= 1, events


def _assert_reconciler_retried(log: str, error: str) -> None:
    """The reconcile handler failed temporarily with `error` (Kopf retries it) and never for good."""
    assert f"Handler 'reconcile' failed temporarily: {error}" in log, log[-3000:]
    assert "failed permanently" not in log, log[-3000:]


def test_500s_on_the_first_status_write_still_converge(
    cluster: Cluster, faults: FaultProxy, proxied_operator: OperatorProcess, namespace: str
) -> None:
    log_start = len(proxied_operator.output())
    rule = faults.fail("patch", "llmtrainingjobs/status", 500, times=2)
    apply_doc(cluster, _job("status500", namespace))
    status = wait_phase(cluster, namespace, "status500", "Running", timeout=60)
    assert rule.hits == 2
    assert status["rayJobName"] == "status500" and status["observedGeneration"] == 1
    assert _conditions(status)["Created"]["status"] == "True"
    writes = [r.status for r in faults.seen("patch", "llmtrainingjobs/status") if r.namespace == namespace]
    assert writes[:3] == [500, 500, 200], writes
    # The mirror alone could converge the phase: the reconciler must have met a 500 and retried it.
    _assert_reconciler_retried(proxied_operator.output()[log_start:], "first status write: HTTP 500")
    _assert_each_transition_announced_once(cluster, namespace, "status500")


def test_500s_on_the_status_write_at_completion_converge(
    cluster: Cluster, faults: FaultProxy, namespace: str
) -> None:
    """KubeRay reports the end while the API server refuses more status writes than the mirror's
    quick retries: the periodic resync re-derives the status from the RayJob and converges."""
    apply_doc(cluster, _job("done500", namespace))
    wait_phase(cluster, namespace, "done500", "Running", timeout=60)
    rule = faults.fail("patch", "llmtrainingjobs/status", 500, times=5)
    end_ray_job(cluster, namespace, "done500", succeed=True)
    status = wait_phase(cluster, namespace, "done500", "Succeeded", "Failed", timeout=60 + 3 * RESYNC_SECONDS)
    assert status["phase"] == "Succeeded", status
    assert rule.hits == 5
    assert _conditions(status)["Succeeded"]["status"] == "True"


def test_500_429_409_on_rayjob_create_are_retried_after_retry_after(
    cluster: Cluster, faults: FaultProxy, namespace: str
) -> None:
    rules = [
        faults.fail("create", "rayjobs", 500, times=1),
        faults.fail("create", "rayjobs", 429, times=1, retry_after=1),
        faults.fail("create", "rayjobs", 409, times=1),
    ]
    apply_doc(cluster, _job("retry", namespace))
    status = wait_phase(cluster, namespace, "retry", "Running", timeout=60)
    assert [r.hits for r in rules] == [1, 1, 1]
    assert len(items(cluster, "rayjobs", namespace)) == 1
    assert _conditions(status)["Created"]["status"] == "True"
    creates = [r for r in faults.seen("create", "rayjobs") if r.namespace == namespace]
    assert [r.status for r in creates[:4]] == [500, 429, 409, 201]
    # A later rerun of the handler (e.g. after a 409 on its first status write) may try again: the
    # real server's AlreadyExists, then adoption of the one RayJob, never a second object.
    assert all(r.status == 409 and not r.injected for r in creates[4:]), creates
    # The next attempt waits for the server's Retry-After (1 s) after the 429.
    assert creates[2].at - creates[1].at >= 1.0


def test_409_on_the_first_status_write_is_retried(
    cluster: Cluster, faults: FaultProxy, proxied_operator: OperatorProcess, namespace: str
) -> None:
    log_start = len(proxied_operator.output())
    rule = faults.fail("patch", "llmtrainingjobs/status", 409, times=1)
    apply_doc(cluster, _job("conflict", namespace))
    status = wait_phase(cluster, namespace, "conflict", "Running", timeout=60)
    assert rule.hits == 1
    assert status["rayJobName"] == "conflict"
    assert _conditions(status)["Created"]["status"] == "True"
    _assert_reconciler_retried(proxied_operator.output()[log_start:], "first status write: HTTP 409")
    _assert_each_transition_announced_once(cluster, namespace, "conflict")


def test_a_status_mirrored_before_the_first_status_write_is_not_overwritten(
    cluster: Cluster, faults: FaultProxy, namespace: str
) -> None:
    """The reconciler's first status write is held 3 s; meanwhile KubeRay runs the RayJob. The
    mirror of that state either waits for the held write (one worker per job: the job's lock) or,
    if it wrote first, makes the held write stale (its resourceVersion), which the real API server
    refuses (409); either way the RayJob's creation-time state never lands over its later one."""
    faults.delay("patch", "llmtrainingjobs/status", 3, times=1)
    apply_doc(cluster, _job("race", namespace))
    wait_phase(cluster, namespace, "race", "Running", timeout=60)
    time.sleep(5)  # the held write (3 s) and any retry of it have landed or been refused
    assert job_status(cluster, namespace, "race")["phase"] == "Running"
    _assert_each_transition_announced_once(cluster, namespace, "race")


def test_latency_on_every_request_still_reaches_running(
    cluster: Cluster, faults: FaultProxy, namespace: str
) -> None:
    rule = faults.delay("*", "*", 0.5)
    apply_doc(cluster, _job("slow", namespace))
    status = wait_phase(cluster, namespace, "slow", "Running", timeout=120)
    assert status["rayJobName"] == "slow"
    assert rule.hits >= 8  # 6 children created and the status written, each 0.5 s late
    # Not asserted here: each transition announced once. With 0.5 s per request, the mirror's read of
    # the job can precede the reconciler's first write and its write follow it, so the job gets both
    # "Created" and "RayJobCreated" for the one transition to Pending (reported as a defect).


def test_restart_midway_adopts_without_duplicates(
    cluster: Cluster, faults: FaultProxy, proxied_operator: OperatorProcess, namespace: str
) -> None:
    # First run: RayJob creation keeps failing, so only the first children exist when it stops.
    faults.fail("create", "rayjobs", 500, times=None)
    apply_doc(cluster, _job("restart", namespace))
    wait_for(lambda: get(cluster, "configmap", "restart-config", namespace), what="the ConfigMap")
    proxied_operator.stop()
    assert get(cluster, "rayjob", "restart", namespace) is None
    faults.clear()
    # Second run: resume adopts what exists and creates the rest, once each.
    since = len(faults.requests)
    proxied_operator.restart()
    _wait_watching(faults, proxied_operator, since)
    wait_phase(cluster, namespace, "restart", "Running", timeout=60)
    assert {kind: len(items(cluster, kind, namespace, "llmtrain.dev/job=restart")) for kind in CHILDREN} == (
        dict.fromkeys(CHILDREN, 1)
    )
    # Third run over a converged job writes none of its children again. The RayJob is left out:
    # KubeRay's own update drops `spec.suspend: false` (Go omitempty), and the operator's resume
    # writes it back once (reported as a defect).
    names = {o["kind"].lower(): o["metadata"]["name"] for o in render(parse_job(_job("restart", namespace)))}
    names.pop("rayjob")

    def versions() -> dict[str, str]:
        return {
            kind: (get(cluster, kind, name, namespace) or {})["metadata"]["resourceVersion"]
            for kind, name in names.items()
        }

    before = versions()
    since = len(faults.requests)
    proxied_operator.restart()
    _wait_watching(faults, proxied_operator, since)
    apply_doc(cluster, _job("canary", namespace))  # proves this operator instance is live
    wait_for(lambda: get(cluster, "rayjob", "canary", namespace), what="the canary's RayJob")
    assert versions() == before


def test_a_reset_connection_and_a_proxys_html_502_are_retried_like_server_errors(
    cluster: Cluster, faults: FaultProxy, proxied_operator: OperatorProcess, namespace: str
) -> None:
    """What a network or a load balancer in front of the API server does: the ConfigMap create has
    its connection reset, the RayJob create gets a load balancer's HTML 502. Both are transient API
    errors the reconciler retries within seconds, not exceptions Kopf backs off from for a minute."""
    log_start = len(proxied_operator.output())
    reset = faults.reset("create", "configmaps", times=1)
    page = faults.fail("create", "rayjobs", 502, times=1, html=True)
    started = time.monotonic()
    apply_doc(cluster, _job("netfault", namespace))
    status = wait_phase(cluster, namespace, "netfault", "Running", timeout=45)
    assert time.monotonic() - started < 30  # Kopf's backoff after an unexpected exception is 60 s
    assert (reset.hits, page.hits) == (1, 1)
    assert status["rayJobName"] == "netfault"
    assert _conditions(status)["Created"]["status"] == "True"
    log = proxied_operator.output()[log_start:]
    _assert_reconciler_retried(log, "HTTP 0 ConnectionError: ProtocolError")
    _assert_reconciler_retried(log, "HTTP 502 Bad Gateway: <html>")
    assert "failed with an exception" not in log, log[-3000:]


# ---- one writer per job: nothing acts on a copy of the job older than a finish ------------------
def _finish_and_delete_rayjob(cluster: Cluster, namespace: str, name: str) -> None:
    """The Ray job succeeds, the job's phase follows, and the RayJob goes, as KubeRay deletes a
    finished one (DELETE_RAYJOB_CR_AFTER_JOB_FINISHES with ttlSecondsAfterFinished 0)."""
    try:
        end_ray_job(cluster, namespace, name, succeed=True)
        assert wait_phase(cluster, namespace, name, "Succeeded", "Failed", timeout=75)["phase"] == "Succeeded"
    finally:
        clear_outcome(cluster, namespace)
    cluster.kubectl("delete", "rayjob", name, "-n", namespace, "--wait=true")


def _assert_stayed_finished(cluster: Cluster, watch: Watch, namespace: str, name: str) -> None:
    """No RayJob again, no recreation announced, and no stored version after Succeeded has
    another phase (the watch sees every write, also one flipped back before a poll would see it)."""
    assert get(cluster, "rayjob", name, namespace) is None, "a RayJob was created for a finished job"
    phases = [(v.get("status") or {}).get("phase") for v in watch.versions(name)]
    assert "Succeeded" in phases, phases
    assert set(phases[phases.index("Succeeded") :]) == {"Succeeded"}, phases
    reasons = [
        e["reason"] for e in items(cluster, "events", namespace) if e["involvedObject"]["name"] == name
    ]
    assert "RayJobRecreated" not in reasons, reasons


def test_a_job_that_finishes_while_a_resync_pass_is_held_up_stays_finished(
    cluster: Cluster, faults: FaultProxy, namespace: str
) -> None:
    """The resync lists the jobs, then the RayJobs. Held up between the two while the job completes
    and its RayJob is deleted, the pass has a job list that says Running and a RayJob list without
    its RayJob: it must read both again before it writes or creates anything."""
    apply_doc(cluster, _job("late", namespace))
    wait_phase(cluster, namespace, "late", "Running", timeout=60)
    with Watch(cluster, "llmtj", namespace) as watch:
        answered = len(faults.seen("list", "rayjobs"))
        rule = faults.delay("list", "rayjobs", 30, times=1)
        wait_for(lambda: rule.hits == 1, timeout=3 * RESYNC_SECONDS, what="the resync's RayJob list held up")
        _finish_and_delete_rayjob(cluster, namespace, "late")
        wait_for(
            lambda: len(faults.seen("list", "rayjobs")) > answered,
            timeout=45,
            what="the held-up list answered",
        )
        time.sleep(RESYNC_SECONDS + 3)  # the rest of that pass, and the next
        _assert_stayed_finished(cluster, watch, namespace, "late")


def test_a_job_that_finishes_while_its_resume_after_a_restart_is_held_up_stays_finished(
    cluster: Cluster, faults: FaultProxy, proxied_operator: OperatorProcess, namespace: str
) -> None:
    """At restart Kopf resumes every job from its list. Held up in that reconcile while the job
    completes and its RayJob is deleted, the reconciler must not create the RayJob again from its
    copy of the job (which says Running), nor write a phase over Succeeded."""
    apply_doc(cluster, _job("resumed", namespace))
    wait_phase(cluster, namespace, "resumed", "Running", timeout=60)
    with Watch(cluster, "llmtj", namespace) as watch:
        rule = faults.delay("get", "serviceaccounts", 30, times=1, namespace=namespace)
        proxied_operator.restart()
        wait_for(lambda: rule.hits == 1, timeout=60, what="the resumed reconcile held up")
        _finish_and_delete_rayjob(cluster, namespace, "resumed")
        wait_for(
            lambda: [r for r in faults.seen("get", "serviceaccounts") if r.namespace == namespace],
            timeout=45,
            what="the held-up read answered",
        )
        time.sleep(RESYNC_SECONDS + 3)  # the rest of the reconcile, and a resync pass
        _assert_stayed_finished(cluster, watch, namespace, "resumed")
