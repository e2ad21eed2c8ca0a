"""Leader election fails closed: a Lease call that raises or hangs after the lease was won ends the
leadership (the operator exits) within the renew deadline, instead of killing or stalling the
client's renew thread while Kopf acts on. The cluster tier proves the same through a real proxy
(tests/cluster/test_leader_election.py); here the Lease API is an in-memory fake, so each case runs
in seconds."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from llmtrain.operator import election
from llmtrain.operator.config import Election


class FakeLeases:
    """The Lease API the lock calls, in memory; `fault` makes every call fail the way a reset
    connection does ("raise") or never answer, as a blackholed one ("hang")."""

    def __init__(self, _timeout: float) -> None:
        self.lease: client.V1Lease | None = None
        self.fault: str | None = None
        self.version = 0

    def _answer(self) -> None:
        if self.fault == "raise":
            raise urllib3.exceptions.MaxRetryError(None, "/leases", "connection reset by peer")  # type: ignore[arg-type]
        if self.fault == "hang":
            threading.Event().wait()

    def read_namespaced_lease(self, name: str, namespace: str) -> client.V1Lease:
        self._answer()
        if self.lease is None:
            missing = ApiException(status=404, reason="Not Found")
            missing.body = json.dumps({"code": 404})
            raise missing
        return copy.deepcopy(self.lease)

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease) -> client.V1Lease:
        return self.replace_namespaced_lease("", namespace, body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease) -> client.V1Lease:
        self._answer()
        self.version += 1
        self.lease = copy.deepcopy(body)
        return copy.deepcopy(body)


@pytest.fixture
def leases(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeLeases]]:
    made: list[FakeLeases] = []

    def build(timeout: float) -> FakeLeases:
        made.append(FakeLeases(timeout))
        return made[-1]

    monkeypatch.setattr(election, "TimedLeases", build)
    yield made


@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_a_leader_whose_lease_calls_fail_or_hang_is_let_go_within_the_renew_deadline(
    leases: list[FakeLeases], fault: str
) -> None:
    settings = Election.for_lease("lock", "ops", 3)  # renew deadline 2 s, retry 1 s
    lost = threading.Event()
    election.wait_until_leading(settings, liveness_port=None, on_lost=lambda *_: lost.set())
    won = leases[0].version
    time.sleep(settings.retry_seconds * 2.5)
    renewed = leases[0].version
    assert renewed > won and not lost.is_set(), "the leader renews while calls succeed"
    leases[0].fault = fault
    failed = time.monotonic()
    assert lost.wait(timeout=settings.lease_seconds * 2), f"a {fault} kept the leader leading"
    # Let go before a standby could take the lease (it waits the whole lease from the last renewal).
    assert time.monotonic() - failed < settings.lease_seconds
    assert leases[0].version == renewed


def test_a_transport_error_is_a_failed_call_that_the_clients_loop_survives() -> None:
    """What the real client raises for a refused connection reaches the election as a failure."""
    configuration = client.Configuration()
    configuration.host = "https://127.0.0.1:1"
    previous = client.Configuration.get_default_copy()
    client.Configuration.set_default(configuration)
    try:
        lock = election.FailClosedLock("lock", "ops", "me", election.TimedLeases(1.0))
    finally:
        client.Configuration.set_default(previous)
    found, error = lock.get("lock", "ops")
    assert not found and isinstance(error, ApiException) and "refused" in str(error.reason)
    record = LeaderElectionRecord("me", "3", "2026-11-26 10:00:00", "2026-11-26 10:00:00")  # type: ignore[no-untyped-call]
    assert lock.create("lock", "ops", record) is False
    assert lock.written_at is None


def test_a_standby_whose_election_thread_died_fails_its_liveness_probe() -> None:
    alive = threading.Event()
    alive.set()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    standby = election._Standby(port, alive.is_set)
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
        alive.clear()
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(url, timeout=5)
        assert failed.value.code == 503
    finally:
        standby.close()
