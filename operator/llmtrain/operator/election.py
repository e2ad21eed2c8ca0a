"""Leader election on a coordination.k8s.io Lease: with several replicas one operator acts and the
others stand by, so no job is ever reconciled by two processes at once.

The election protocol is the Kubernetes client's (`kubernetes.leaderelection`). What this module adds
is what an operator needs around it: standing by before Kopf starts (a standby holds no watch and
writes nothing), answering liveness probes while it waits, and leaving the process at once when
the lease is lost, as client-go's controllers do, so that two leaders never overlap for longer
than one renew period (the pod's restart makes it a standby again), and handing the lease over on a
graceful stop, so that a rolling update does not wait out the lease.

It also makes the client's election fail closed. As shipped, its Lease lock catches only
`ApiException`: a refused or reset connection (urllib3's `MaxRetryError`) escapes the renew loop and
ends the election thread without calling `onstopped_leading`, while Kopf acts on; and its Lease
calls have no timeout, so a blackholed connection holds a renewal past the lease. Here every failure
of a Lease call counts as a failed renewal, each call times out within half the renew deadline, and
a watchdog ends the process when the election thread dies or no renewal has succeeded for the
renew deadline, whatever the client's loop is doing. The standby's `/healthz` fails once the
election thread is gone.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from llmtrain.operator.config import Election

LOG = logging.getLogger("llmtrain.election")
LOST_EXIT_CODE = 3


class _Standby:
    """Answers `/healthz` while the process waits for the lease (Kopf's endpoint starts only once
    it leads, on the same port), so the liveness probe does not restart a healthy standby; it
    answers 503 once `alive()` is false (a standby whose election thread died never leads)."""

    def __init__(self, port: int | None, alive: Callable[[], bool]) -> None:
        self._server: ThreadingHTTPServer | None = None
        if port:

            class Handler(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    ok = alive()
                    body = b'{"standby": true}' if ok else b'{"standby": true, "election": "dead"}'
                    code = (200 if ok else 503) if self.path.startswith("/healthz") else 404
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, format: str, *args: Any) -> None:
                    pass

            ThreadingHTTPServer.allow_reuse_address = True
            self._server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
            threading.Thread(target=self._server.serve_forever, name="standby-healthz", daemon=True).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _lost(holder: str, election: Election) -> None:
    LOG.error(
        "lost the lease %s/%s (%s): exiting so that only the new leader acts",
        election.lease_namespace,
        election.lease_name,
        holder,
    )
    logging.shutdown()
    os._exit(LOST_EXIT_CODE)


class TimedLeases:
    """The three Lease calls the client's lock makes, on a client of their own: no urllib3 retries
    (a reset or refused connection fails the call at once; the election retries at its own period),
    and each call bounded by `timeout`."""

    def __init__(self, timeout: float) -> None:
        configuration = client.Configuration.get_default_copy()
        configuration.retries = False
        self._api = client.CoordinationV1Api(client.ApiClient(configuration))
        self._timeout = timeout

    def read_namespaced_lease(self, name: str, namespace: str) -> client.V1Lease:
        return self._api.read_namespaced_lease(name, namespace, _request_timeout=self._timeout)

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease) -> client.V1Lease:
        return self._api.create_namespaced_lease(namespace, body, _request_timeout=self._timeout)

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease) -> client.V1Lease:
        return self._api.replace_namespaced_lease(name, namespace, body, _request_timeout=self._timeout)


class FailClosedLock(LeaseLock):  # type: ignore[misc]  # the client's election has no type hints
    """The client's Lease lock, with every failure a failed call and the start of the last
    successful write remembered (the watchdog's clock).

    The client's loop reads a failed `get` as `(False, error)` and logs `error.reason`; any other
    exception would end its thread, so transport errors become an `ApiException` without a status.
    """

    def __init__(self, name: str, namespace: str, identity: str, api: TimedLeases) -> None:
        super().__init__(name, namespace, identity)  # type: ignore[no-untyped-call]
        self.api_instance = api  # type: ignore[assignment]  # the same three calls, with timeouts
        # When the last successful create or update was sent (monotonic): the lease it wrote runs
        # for lease_seconds from a moment no earlier than this.
        self.written_at: float | None = None

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            return super().get(name, namespace)  # type: ignore[no-any-return,no-untyped-call]
        except Exception as exc:  # every failure is a failed renewal, never a dead thread
            LOG.warning("reading the lease failed: %s", exc)
            return False, ApiException(reason=f"{type(exc).__name__}: {exc}")

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        return self._write(super().create, name, namespace, election_record)

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        return self._write(super().update, name, namespace, updated_record)

    def _write(self, call: Callable[..., Any], *args: Any) -> bool:
        sent = time.monotonic()
        try:
            ok = bool(call(*args))
        except Exception as exc:  # as in get
            LOG.warning("writing the lease failed: %s", exc)
            return False
        if ok:
            self.written_at = sent
        return ok


def _watch(
    thread: threading.Thread,
    lock: FailClosedLock,
    leading: threading.Event,
    election: Election,
    on_lost: Callable[[], None],
) -> None:
    """End the process when the election can no longer be trusted: its thread died (a leader that
    stopped renewing, or a standby that would never lead), or, while leading, no renewal succeeded
    for the renew deadline (a standby may take over only after the lease, which is longer)."""
    period = min(0.5, election.retry_seconds / 2)
    while True:
        time.sleep(period)
        if not thread.is_alive():
            # A leader's loop ends through on_lost itself; an ending without it (an exception) is
            # a leader that no longer renews, or a standby that would never lead.
            LOG.error("the leader election thread ended")
            on_lost()
            return
        written = lock.written_at
        if leading.is_set() and written is not None:
            late = time.monotonic() - written
            if late > election.renew_deadline_seconds:
                LOG.error("no lease renewal succeeded for %.1f s", late)
                on_lost()
                return


def wait_until_leading(
    election: Election, *, liveness_port: int | None, on_lost: Callable[[str, Election], None] = _lost
) -> str:
    """Block until this process holds the Lease; keep renewing it in a daemon thread afterwards.

    Returns this process's holder identity. `on_lost` runs when a renewal fails for the whole
    renew deadline, when a renewal hangs that long, or when the election thread dies while
    leading; by default it ends the process.
    """
    holder = election.holder()
    leading = threading.Event()
    lock = FailClosedLock(
        election.lease_name, election.lease_namespace, holder, TimedLeases(election.request_seconds)
    )
    lost_once = threading.Lock()

    def lost() -> None:
        if lost_once.acquire(blocking=False):  # the watchdog and the client's loop may both see it
            on_lost(holder, election)

    config = electionconfig.Config(  # type: ignore[no-untyped-call]
        lock,
        lease_duration=election.lease_seconds,
        renew_deadline=election.renew_deadline_seconds,
        retry_period=election.retry_seconds,
        onstarted_leading=leading.set,
        onstopped_leading=lost,
    )
    thread = threading.Thread(
        target=leaderelection.LeaderElection(config).run,  # type: ignore[no-untyped-call]
        name="leader-election",
        daemon=True,
    )
    standby = _Standby(liveness_port, thread.is_alive)
    LOG.info("standing by for the lease %s/%s as %s", election.lease_namespace, election.lease_name, holder)
    thread.start()
    threading.Thread(
        target=_watch, args=(thread, lock, leading, election, lost), name="election-watchdog", daemon=True
    ).start()
    try:
        leading.wait()
    finally:
        standby.close()
    LOG.info("leading as %s: the operator starts", holder)
    return holder


def release(election: Election, holder: str) -> None:
    """Give the lease up on a graceful stop (client-go's ReleaseOnCancel): a standby takes over at
    its next retry instead of after the whole lease. Best effort: the lease runs out anyway."""
    api = client.CoordinationV1Api()
    try:
        lease = api.read_namespaced_lease(election.lease_name, election.lease_namespace)
        if lease.spec is None or lease.spec.holder_identity != holder:
            return
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        lease.spec.renew_time = datetime.now(UTC)
        # A replace carries the resourceVersion read above: a lease taken meanwhile is not touched.
        api.replace_namespaced_lease(election.lease_name, election.lease_namespace, lease)
        LOG.info("released the lease %s/%s", election.lease_namespace, election.lease_name)
    except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:  # refused, reset, timed out
        LOG.warning("could not release the lease (it expires by itself): %s", exc)
