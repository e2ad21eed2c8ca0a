"""Fault injection in front of the real API server: an HTTPS reverse proxy with rules.

The real kube-apiserver cannot be told to fail the next RayJob create, so a client (the operator) is
pointed at this proxy instead. Every request is forwarded as is, watch streams and chunked lists
included, unless a rule matches it: then the proxy answers with a Kubernetes `Status` (500, 429 with
Retry-After, 409, 403...) or a load balancer's HTML page without forwarding, drops the connection
(TCP RST), or forwards it late (`faults.py` has the rules).

The client's bearer token is passed through, so RBAC still judges the client's own identity; a client
authenticating by certificate cannot be proxied (TLS ends here), nor can protocol upgrades (exec,
port-forward). The proxy serves the cluster's
`webhook` certificate (127.0.0.1, signed by the cluster CA), so a kubeconfig with the cluster's CA
verifies it, and it verifies the API server against the same CA.

It runs its own event loop in a thread, so synchronous tests set rules while it serves:

    with FaultProxy(cluster) as proxy:
        rule = proxy.fail("create", "rayjobs", 429, retry_after=1)
        ...  # a client using proxy.url
        assert rule.hits == 1
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from tests.support.cluster.cluster import Cluster
from tests.support.cluster.faults import REASONS, Fault, Faults, status_body

# Per-connection headers (RFC 9110 §7.6.1) are the proxy's own on each side; everything else passes.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Subresources of a namespace itself: `/api/v1/namespaces/x/status` is not a resource "status" in x.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True)
class RequestInfo:
    """A request as the API server's authorizer sees it: verb, group, resource[/subresource]."""

    verb: str
    group: str = ""
    plural: str = ""  # empty: a non-resource URL (discovery, /version, /openapi)
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None

    @property
    def resource(self) -> str:
        return f"{self.plural}/{self.subresource}" if self.subresource else self.plural


@dataclass(frozen=True)
class Seen:
    """One request the proxy handled, and the status its client got (injected or the server's)."""

    verb: str
    resource: str
    namespace: str | None
    name: str | None
    status: int
    injected: bool
    at: float  # time.monotonic() when the answer's status was known


def request_info(method: str, path_qs: str) -> RequestInfo:
    """Kubernetes' verb and resource of a request, as the API server derives them (RequestInfo)."""
    split = urlsplit(path_qs)
    parts = [p for p in split.path.split("/") if p]
    query = parse_qs(split.query)
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return RequestInfo(verb=method.lower())
    watch = query.get("watch", [""])[0] in ("1", "true")
    if rest[:1] == ["watch"]:  # the deprecated /watch/ prefix
        watch, rest = True, rest[1:]
    if not rest:
        return RequestInfo(verb=method.lower())
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if plural == "namespaces" and namespace is not None and name is None:
        name = namespace  # /api/v1/namespaces/x: the namespace x itself
    if method == "GET":
        verb = "watch" if watch else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _METHOD_VERBS.get(method, method.lower())
    return RequestInfo(verb, group, plural, subresource, namespace, name)


class FaultProxy:
    """An HTTPS reverse proxy to `cluster.server` that injects faults by rule (see the module doc)."""

    def __init__(self, cluster: Cluster) -> None:
        pki = cluster.directory / "pki"
        self.upstream = cluster.server.rstrip("/")
        self.faults = Faults()
        self._requests: list[Seen] = []
        self._lock = threading.Lock()
        self._serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._serving.load_cert_chain(str(pki / "webhook.crt"), str(pki / "webhook.key"))
        self._upstream_tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self.url = ""

    # ---- rules ---------------------------------------------------------------------------------
    def fail(
        self,
        verb: str,
        resource: str,
        status: int = 500,
        *,
        times: int | None = 1,
        retry_after: float | None = None,
        message: str | None = None,
        html: bool = False,
    ) -> Fault:
        """Answer the next `times` matching requests (None: all, until cleared) with `status`; `html`:
        with an HTML page instead of a Kubernetes Status, as a load balancer in front of it does."""
        return self.faults.fail(
            verb, resource, status, times=times, retry_after=retry_after, message=message, html=html
        )

    def reset(self, verb: str, resource: str, *, times: int | None = 1) -> Fault:
        """Drop the connection of the next `times` matching requests without an answer (TCP RST)."""
        return self.faults.reset(verb, resource, times=times)

    def delay(
        self,
        verb: str,
        resource: str,
        seconds: float,
        *,
        times: int | None = None,
        namespace: str | None = None,
    ) -> Fault:
        """Forward the matching requests (in `namespace` only, if given) only after `seconds` (None
        times: all, until cleared)."""
        return self.faults.delay(verb, resource, seconds, times=times, namespace=namespace)

    def clear(self) -> None:
        self.faults.clear()

    @property
    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self._requests)

    def seen(self, verb: str, resource: str) -> list[Seen]:
        return [r for r in self.requests if r.verb == verb and r.resource == resource]

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout: float = 10) -> FaultProxy:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:  # reported to start()'s caller below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or failure:
            raise RuntimeError(f"the fault proxy did not start: {failure[:1]}")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def _open(self) -> None:
        # No total or read timeout: a watch stays open as long as the client and server keep it.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._upstream_tls, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,  # bytes pass through as the server encoded them
        )
        # A client hanging up on a watch cancels its handler, which closes the upstream stream too.
        self._runner = web.ServerRunner(
            web.Server(self._handle, handler_cancellation=True), shutdown_timeout=1
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._serving)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"https://127.0.0.1:{port}"

    async def _close(self) -> None:
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # ---- serving -------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            return await self._serve(request)
        finally:
            self._inflight.discard(task)

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        info = request_info(request.method, request.raw_path)
        rule = (
            self.faults.take(info.verb, info.group, info.plural, info.subresource, info.namespace)
            if info.plural
            else None
        )
        if rule is not None and rule.delay:
            await asyncio.sleep(rule.delay)
        body = await request.content.read()  # no size limit of its own: the API server applies one
        if rule is not None and rule.status is not None:
            self._record(info, rule.status, injected=True)
            if rule.answer == "reset":
                return _reset(request)
            return self._injected(info, rule)
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP)
        assert self._session is not None
        try:
            upstream = await self._session.request(
                request.method,
                URL(self.upstream + request.raw_path, encoded=True),
                headers=headers,
                data=body or None,
                allow_redirects=False,
                # A body without a Content-Type stays without one (the API server reads it as JSON;
                # the kubernetes client's Lease calls send none), not aiohttp's octet-stream.
                skip_auto_headers=() if "Content-Type" in headers else ("Content-Type",),
            )
        except aiohttp.ClientError as exc:
            self._record(info, 502, injected=False)
            return _status_response(502, "BadGateway", f"fault proxy: upstream unreachable: {exc}")
        async with upstream:
            self._record(info, upstream.status, injected=False)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_BY_HOP:
                    response.headers.add(key, value)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            # iter_any yields what arrived: each watch event reaches the client when the server sends it.
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    def _injected(self, info: RequestInfo, rule: Fault) -> web.Response:
        assert rule.status is not None
        reason = REASONS.get(rule.status, "Unknown")
        if rule.answer == "html":
            page = f"<html><body><h1>{rule.status} {reason}</h1></body></html>"
            return web.Response(status=rule.status, text=page, content_type="text/html")
        message = rule.message or f"injected by the fault proxy: {info.verb} {info.resource}"
        details: dict[str, Any] = {"kind": info.plural, "group": info.group}
        if info.name:
            details["name"] = info.name
        headers: dict[str, str] = {}
        if rule.retry_after is not None:
            headers["Retry-After"] = f"{rule.retry_after:g}"
            details["retryAfterSeconds"] = int(rule.retry_after)
        return _status_response(rule.status, reason, message, details, headers)

    def _record(self, info: RequestInfo, status: int, *, injected: bool) -> None:
        with self._lock:
            self._requests.append(
                Seen(info.verb, info.resource, info.namespace, info.name, status, injected, time.monotonic())
            )


def _reset(request: web.BaseRequest) -> web.Response:
    """Drop the client's connection with a TCP RST (SO_LINGER 0), as a crashing peer or a middlebox
    does; the returned response is never sent."""
    transport = request.transport
    assert transport is not None
    transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
    )
    transport.abort()
    return web.Response()


def _status_response(
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=code,
        body=json.dumps(status_body(code, reason, message, details)).encode(),
        content_type="application/json",
        headers=headers,
    )
