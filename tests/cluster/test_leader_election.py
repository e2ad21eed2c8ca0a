"""Two `llmtrain operator --leader-elect` processes against one real API server, as the chart runs
`replicaCount: 2`: only the holder of the Lease acts, the standby answers its liveness probe and
writes nothing, takes over when the leader crashes (within the lease) or stops (at once: the lease
is handed over), and a leader whose lease is taken from it exits instead of acting on. A leader cut
off from its Lease (reset connections, then none answered) exits before the standby may take over,
as the API server's audit log shows: never two writers at once.

The session's operator is stopped meanwhile, so every job's progress is one of these processes' doing.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from llmtrain.operator.election import LOST_EXIT_CODE

from tests.support.cluster import audit
from tests.support.cluster.cluster import Cluster
from tests.support.cluster.fault_proxy import FaultProxy
from tests.support.cluster.steps import (
    OPERATOR_USER,
    PLATFORM_NAMESPACE,
    RESYNC_SECONDS,
    OperatorProcess,
    apply_doc,
    cpu_job,
    get,
    start_operator,
    wait_for,
    wait_phase,
)

LEASE_SECONDS = 10  # renew deadline 6 s, retry 1 s (client-go's proportions)


def _elected(cluster: Cluster, directory: Path, name: str, lease: str) -> OperatorProcess:
    return start_operator(
        cluster,
        directory,
        name,
        log_format="json",
        args=(
            "--leader-elect",
            f"--leader-election-name={lease}",
            f"--leader-election-namespace={PLATFORM_NAMESPACE}",
            f"--lease-seconds={LEASE_SECONDS}",
        ),
    )


def _records(op: OperatorProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in op.output().splitlines() if line.startswith("{")]


def _said(op: OperatorProcess, text: str) -> str | None:
    return next((r["message"] for r in _records(op) if text in r.get("message", "")), None)


def _leading(op: OperatorProcess) -> bool:
    return _said(op, "leading as") is not None


def _holder(cluster: Cluster, lease: str) -> str | None:
    obj = get(cluster, "lease", lease, PLATFORM_NAMESPACE)
    return None if obj is None else obj["spec"].get("holderIdentity")


def _identity(op: OperatorProcess) -> str:
    """The holder identity the process announced when it began standing by."""
    message = _said(op, "standing by for the lease")
    assert message is not None, op.output()[-2000:]
    return message.rsplit(" as ", 1)[1].strip()


def _healthz(op: OperatorProcess) -> tuple[int, str]:
    port = int(next(a for a in op.argv if a.startswith("--liveness-port=")).split("=", 1)[1])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return int(response.status), response.read().decode()
    except OSError:
        return 0, ""


def _metrics(op: OperatorProcess) -> str:
    port = int(next(a for a in op.argv if a.startswith("--metrics-port=")).split("=", 1)[1])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def _series(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _handled(op: OperatorProcess, namespace: str, name: str) -> bool:
    """Kopf names the object of every handler's log record."""
    return any(
        (r.get("object") or {}).get("name") == name and r["object"].get("namespace") == namespace
        for r in _records(op)
    )


@pytest.mark.usefixtures("jobs_deleted_first")
def test_one_replica_acts_the_standby_takes_over_on_a_crash_and_at_once_on_a_graceful_stop(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    operator.stop()
    lease = f"election-{namespace}"[:63]
    running: list[OperatorProcess] = []
    try:
        first = _elected(cluster, tmp_path, "first", lease)
        running.append(first)
        wait_for(lambda: _leading(first), what="the first operator leads")
        second = _elected(cluster, tmp_path, "second", lease)
        running.append(second)
        # The standby is alive for its probe, but neither leads nor handles anything.
        wait_for(lambda: _healthz(second) == (200, json.dumps({"standby": True})), what="standby liveness")
        assert _holder(cluster, lease) == _identity(first)
        apply_doc(cluster, cpu_job("before", namespace, suspend=True))
        wait_phase(cluster, namespace, "before", "Suspended")
        assert _handled(first, namespace, "before")
        time.sleep(2)
        assert not _leading(second) and not _handled(second, namespace, "before"), second.output()[-2000:]
        # Its metrics say it stands by, and nothing about jobs it does not see (no zeros).
        standing = _metrics(second)
        assert _series(standing, "llmtrain_leader ") == ["llmtrain_leader 0.0"], standing
        assert not _series(standing, "llmtrain_jobs{") and not _series(standing, "llmtrain_resync_")
        leading = _metrics(first)
        assert _series(leading, "llmtrain_leader ") == ["llmtrain_leader 1.0"]
        assert 'llmtrain_jobs{phase="Suspended"} 1.0' in _series(leading, "llmtrain_jobs{")

        # A crash (no hand-over): the standby takes over once the lease runs out.
        first.stop(kill=True)
        crashed = time.monotonic()
        wait_for(lambda: _leading(second), timeout=LEASE_SECONDS * 3, what="the standby leads")
        took_over = time.monotonic() - crashed
        assert took_over < LEASE_SECONDS + 5, took_over
        assert _holder(cluster, lease) == _identity(second)
        apply_doc(cluster, cpu_job("after-crash", namespace, suspend=True))
        wait_phase(cluster, namespace, "after-crash", "Suspended")
        assert _handled(second, namespace, "after-crash")
        took = _metrics(second)
        assert _series(took, "llmtrain_leader ") == ["llmtrain_leader 1.0"]
        wait_for(
            lambda: _series(_metrics(second), "llmtrain_resync_last_success_timestamp_seconds "),
            timeout=RESYNC_SECONDS * 3,
            what="a resync pass of the new leader",
        )

        # A graceful stop (a rolling update) hands the lease over: no waiting out the lease.
        third = _elected(cluster, tmp_path, "third", lease)
        running.append(third)
        wait_for(lambda: _said(third, "standing by for the lease"), what="the third stands by")
        second.stop()
        assert second.proc.returncode == 0 and _said(second, "released the lease"), second.output()[-2000:]
        stopped = time.monotonic()
        wait_for(lambda: _leading(third), timeout=LEASE_SECONDS * 3, what="the third leads")
        handed_over = time.monotonic() - stopped
        assert handed_over < LEASE_SECONDS / 2, handed_over
        apply_doc(cluster, cpu_job("after-stop", namespace, suspend=True))
        wait_phase(cluster, namespace, "after-stop", "Suspended")
        assert _handled(third, namespace, "after-stop")
        print(f"\ntakeover after a crash {took_over:.1f} s, after a graceful stop {handed_over:.1f} s")
    finally:
        for op in running:
            op.stop()
        operator.start()


@pytest.mark.usefixtures("jobs_deleted_first")
def test_a_leader_whose_lease_is_taken_exits_instead_of_acting_on(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    operator.stop()
    lease = f"stolen-{namespace}"[:63]
    leader = _elected(cluster, tmp_path, "leader", lease)
    try:
        wait_for(lambda: _leading(leader), what="the operator leads")
        # Another holder (e.g. a replica that could not see this one renew) takes the Lease.
        body = {
            "spec": {
                "holderIdentity": "intruder",
                "leaseDurationSeconds": 60,
                "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            }
        }
        taken = time.monotonic()
        cluster.kubectl(
            "patch", "lease", lease, "-n", PLATFORM_NAMESPACE, "--type=merge", "-p", json.dumps(body)
        )
        code = leader.proc.wait(timeout=LEASE_SECONDS * 3)
        assert code == LOST_EXIT_CODE, leader.output()[-2000:]
        assert time.monotonic() - taken < LEASE_SECONDS, "it must stop before the new holder's lease"
        assert _said(leader, "lost the lease"), leader.output()[-2000:]
        assert _holder(cluster, lease) == "intruder"
    finally:
        leader.stop()
        operator.start()


RESET_SECONDS = 2  # shorter than the renew deadline: the leader must survive resets to see the blackhole
BLACKHOLE_SECONDS = 20


def _writers(cluster: Cluster, since: int) -> dict[str, tuple[Any, Any]]:
    """Each operator token's first and last write (Lease calls aside: that is the election itself)."""
    times: dict[str, list[Any]] = defaultdict(list)
    for call in audit.calls(cluster.audit_log, OPERATOR_USER, since):
        if call.verb in audit.WRITES and call.resource != "leases":
            times[call.credential].append(call.at)
    return {credential: (min(at), max(at)) for credential, at in times.items()}


@pytest.mark.usefixtures("jobs_deleted_first")
def test_a_leader_cut_off_from_its_lease_exits_before_the_standby_takes_over(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """The kubernetes client's election dies on a transport error without letting go (its lock
    catches only ApiException) and waits on a blackholed call without a timeout: here the leader's
    Lease calls are reset, then go unanswered, while its watches and writes still work."""
    operator.stop()
    lease = f"cutoff-{namespace}"[:63]
    since = audit.size(cluster.audit_log)
    running: list[OperatorProcess] = []
    try:
        with FaultProxy(cluster) as proxy:
            leader = _elected(dataclasses.replace(cluster, server=proxy.url), tmp_path, "leader", lease)
            running.append(leader)
            wait_for(lambda: _leading(leader), what="the proxied operator leads")
            standby = _elected(cluster, tmp_path, "standby", lease)
            running.append(standby)
            wait_for(lambda: _said(standby, "standing by for the lease"), what="the standby waits")
            apply_doc(cluster, cpu_job("before", namespace, suspend=True))
            wait_phase(cluster, namespace, "before", "Suspended")
            assert _handled(leader, namespace, "before")

            cut = time.monotonic()
            proxy.reset("*", "leases", times=None)  # an API server restarting
            time.sleep(RESET_SECONDS)
            proxy.clear()
            proxy.delay("*", "leases", BLACKHOLE_SECONDS)  # then a partition: nothing answers
            # Whichever comes first: the leader letting go, or the standby taking over.
            wait_for(
                lambda: leader.proc.poll() is not None or _leading(standby),
                timeout=LEASE_SECONDS * 3,
                what="the leader exits or the standby leads",
            )
            first = time.monotonic() - cut
            exited = leader.proc.poll()
            wait_for(lambda: _leading(standby), timeout=LEASE_SECONDS * 3, what="the standby leads")
            apply_doc(cluster, cpu_job("after", namespace, suspend=True))
            wait_phase(cluster, namespace, "after", "Suspended")
            assert _handled(standby, namespace, "after")
            time.sleep(max(0.0, cut + RESET_SECONDS + BLACKHOLE_SECONDS - time.monotonic()))
            proxy.clear()

        writers = sorted(_writers(cluster, since).values())
        assert len(writers) == 2, writers  # the leader before the cut, the standby after it
        (_, leader_last), (standby_first, _) = writers
        assert leader_last < standby_first, (
            f"two operators wrote at once: the old leader until {leader_last}, the new from {standby_first}"
        )
        assert exited == LOST_EXIT_CODE, (exited, leader.output()[-3000:])
        assert first < LEASE_SECONDS, f"the leader let go {first:.1f} s after the cut, past the lease"
        assert not _handled(leader, namespace, "after")
        print(f"\nthe cut-off leader exited {first:.1f} s after its Lease calls failed")
    finally:
        for op in running:
            op.stop()
        operator.start()
