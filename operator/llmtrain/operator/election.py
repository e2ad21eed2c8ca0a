"""Leader election on a coordination.k8s.io Lease: with several replicas one operator acts and the
others stand by, so no job is ever reconciled by two processes at once.

The election itself is the Kubernetes client's (`kubernetes.leaderelection`). What this module adds
is what an operator needs around it: standing by before Kopf starts (a standby holds no watch and
writes nothing), answering liveness probes while it waits, and leaving the process at once when
the lease is lost, as client-go's controllers do, so that two leaders never overlap for longer
than one renew period (the pod's restart makes it a standby again), and handing the lease over on a
graceful stop, so that a rolling update does not wait out the lease.
"""

from __future__ import annotations

import logging
import os
import threading
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
    it leads, on the same port), so the liveness probe does not restart a healthy standby."""

    def __init__(self, port: int | None) -> None:
        self._server: ThreadingHTTPServer | None = None
        if port:

            class Handler(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    body = b'{"standby": true}'
                    self.send_response(200 if self.path.startswith("/healthz") else 404)
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


def wait_until_leading(
    election: Election, *, liveness_port: int | None, on_lost: Callable[[str, Election], None] = _lost
) -> str:
    """Block until this process holds the Lease; keep renewing it in a daemon thread afterwards.

    Returns this process's holder identity. `on_lost` runs (in the renew thread) when a renewal
    fails for the whole renew deadline; by default it ends the process.
    """
    holder = election.holder()
    leading = threading.Event()
    # The client's election module has no type hints.
    config = electionconfig.Config(  # type: ignore[no-untyped-call]
        LeaseLock(election.lease_name, election.lease_namespace, holder),  # type: ignore[no-untyped-call]
        lease_duration=election.lease_seconds,
        renew_deadline=election.renew_deadline_seconds,
        retry_period=election.retry_seconds,
        onstarted_leading=leading.set,
        onstopped_leading=lambda: on_lost(holder, election),
    )
    standby = _Standby(liveness_port)
    LOG.info("standing by for the lease %s/%s as %s", election.lease_namespace, election.lease_name, holder)
    thread = threading.Thread(
        target=leaderelection.LeaderElection(config).run,  # type: ignore[no-untyped-call]
        name="leader-election",
        daemon=True,
    )
    thread.start()
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
