"""A stand-in for the Ray dashboard's job API, reached by KubeRay's operator through HTTP_PROXY.

No Ray runs in the cluster tier, so nothing would answer KubeRay's `GET /api/jobs/<id>` at
`<cluster>-head-svc.<ns>.svc.cluster.local:8265`, and without an answer a RayJob can never
succeed (KubeRay fails it 30 s after its submitter finishes). KubeRay's dashboard client is a
plain Go HTTP client, so starting the operator with `HTTP_PROXY` pointing here sends those
requests to this server, absolute URI and all; the API server (https, 127.0.0.1) is never proxied.

A Ray job is RUNNING until a test says otherwise: `PUT /control/<namespace>/<rayjob>` with
`{"status": "SUCCEEDED"|"FAILED"|"RUNNING"|"STOPPED", "message": "..."}` sets the status of every
Ray job submitted for that RayJob (KubeRay names each submission `<rayjob>-<suffix>`).
`GET /control` lists what was asked, for debugging, and the Ray auth token each Ray cluster's
requests carried.

Like Ray's dashboard with token authentication on (KubeRay's `authOptions.mode: token`, which every
rendered RayJob sets), a job request without `x-ray-authorization: Bearer <token>` is refused with
401, so a RayJob rendered without authentication can never leave Running here either.

With a real node (`--netns`), a Ray head may really run: a request for a Service whose endpoints
are on the real node is forwarded to the Service's ClusterIP (kube-proxy takes it to the head
pod), or to the ready pod's address for a headless Service such as KubeRay's head Service, from a
socket opened inside the node's network namespace, and its answer goes back as is.
Services of kwok's pods (or with no endpoints) keep the fake answers above.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.support.cluster import netns

_HOST = re.compile(r"^(?P<cluster>[a-z0-9-]+)-head-svc\.(?P<namespace>[a-z0-9-]+)\.svc")
_JOB = re.compile(r"^/api/jobs/(?P<id>[^/]+)(?P<stop>/stop)?/?$")
_SERVICE = re.compile(r"^(?P<service>[a-z0-9-]+)\.(?P<namespace>[a-z0-9-]+)\.svc(\.cluster\.local)?\.?$")
# Not forwarded: they describe one hop (RFC 9110 7.6.1), and the body is re-framed here.
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


@dataclass(frozen=True)
class RealNode:
    """Where a request for a Service backed by the real node's pods goes: the API server says
    where a Service's endpoints are, the node's network namespace is where the ClusterIP works."""

    netns_path: str
    node_name: str
    api_server: str
    ssl_context: ssl.SSLContext

    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.api_server + path, timeout=10, context=self.ssl_context) as response:
            body: dict[str, Any] = json.load(response)
            return body

    def address(self, service: str, namespace: str) -> str | None:
        """Where to send a request for the Service when any of its endpoints (ready or not) is on
        the real node: its ClusterIP, or for a headless Service (KubeRay's head Service is one)
        the address of an endpoint there, as cluster DNS would answer; else None."""
        selector = urllib.parse.quote(f"kubernetes.io/service-name={service}")
        try:
            slices = self._get(
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector={selector}"
            )["items"]
            endpoints = [e for s in slices for e in s.get("endpoints") or []]
            here = [e for e in endpoints if e.get("nodeName") == self.node_name]
            if not here:
                return None
            spec = self._get(f"/api/v1/namespaces/{namespace}/services/{service}")["spec"]
        except (urllib.error.URLError, OSError, KeyError):
            return None
        ip: str | None = spec.get("clusterIP")
        if ip and ip != "None":
            return ip
        # A ready pod first; one that is not (yet) gets the request all the same and the caller a
        # 502 if nothing listens, never the fake answers meant for kwok's pods.
        here.sort(key=lambda e: not (e.get("conditions") or {}).get("ready"))
        return str(here[0]["addresses"][0])

    def connection(self, ip: str, port: int) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(ip, port, timeout=30)
        conn.sock = netns.connect_in(self.netns_path, ip, port, timeout=30)
        return conn


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[tuple[str, str], dict[str, str]] = {}
        self.started: dict[str, float] = {}
        self.seen: list[str] = []
        self.tokens: dict[str, str] = {}

    def job_info(self, namespace: str, job_id: str) -> dict[str, Any]:
        with self.lock:
            self.seen.append(f"{namespace}/{job_id}")
            start = self.started.setdefault(job_id, time.time())
            outcome: dict[str, str] = {"status": "RUNNING", "message": "running (fake dashboard)"}
            # The longest RayJob name that prefixes the submission id wins.
            for (ns, rayjob), value in sorted(self.outcomes.items(), key=lambda kv: -len(kv[0][1])):
                if ns == namespace and job_id.startswith(rayjob + "-"):
                    outcome = value
                    break
        done = outcome["status"] in ("SUCCEEDED", "FAILED", "STOPPED")
        return {
            "type": "SUBMISSION",
            "job_id": job_id,
            "submission_id": job_id,
            "status": outcome["status"],
            "message": outcome.get("message", ""),
            "error_type": "" if outcome["status"] != "FAILED" else "JOB_ENTRYPOINT_COMMAND_ERROR",
            "entrypoint": "python -m llmtrain_trainer.main",
            "start_time": int(start * 1000),
            "end_time": int(time.time() * 1000) if done else 0,
            "metadata": {},
            "runtime_env": {},
        }


def _handler(state: _State, real_node: RealNode | None = None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            host = url.hostname or self.headers.get("Host", "").split(":")[0]
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if url.path.startswith("/control"):
                return self._control(method, url.path, body)
            service = _SERVICE.match(host)
            if real_node and service:
                ip = real_node.address(service.group("service"), service.group("namespace"))
                if ip:
                    return self._forward(real_node, ip, url.port or 80, method, body)
            host_match, job_match = _HOST.match(host), _JOB.match(url.path)
            if not host_match or not job_match:
                return self._reply(404, {"error": f"fake dashboard: no route for {method} {self.path}"})
            namespace = host_match.group("namespace")
            token = self.headers.get("x-ray-authorization", "").removeprefix("Bearer ").strip()
            if not token:
                return self._reply(401, {"error": "Unauthorized: a Ray auth token is required"})
            with state.lock:
                state.tokens[f"{namespace}/{host_match.group('cluster')}"] = token
            if job_match.group("stop"):
                return self._reply(200, {"stopped": True})
            if method == "DELETE":
                return self._reply(200, {"deleted": True})
            return self._reply(200, state.job_info(namespace, job_match.group("id")))

        def _forward(self, node: RealNode, ip: str, port: int, method: str, body: bytes) -> None:
            """The request, headers and body as received, to the Service inside the node."""
            url = urlsplit(self.path)
            target = url.path + (f"?{url.query}" if url.query else "")
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            try:
                conn = node.connection(ip, port)
                try:
                    conn.request(method, target or "/", body=body or None, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
            except (OSError, http.client.HTTPException) as e:
                return self._reply(502, {"error": f"real node: {ip}:{port}: {e}"})
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP_HEADERS:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _control(self, method: str, path: str, body: bytes) -> None:
            parts = [p for p in path.split("/") if p][1:]
            if method == "GET":
                with state.lock:
                    listed = {f"{ns}/{job}": v for (ns, job), v in state.outcomes.items()}
                    return self._reply(
                        200, {"outcomes": listed, "seen": state.seen[-50:], "tokens": dict(state.tokens)}
                    )
            if method == "PUT" and len(parts) == 2:
                outcome = json.loads(body or b"{}")
                with state.lock:
                    state.outcomes[(parts[0], parts[1])] = outcome
                return self._reply(200, outcome)
            return self._reply(400, {"error": "PUT /control/<namespace>/<rayjob> {status, message}"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    real = parser.add_argument_group("real node (forward requests for Services of its pods)")
    real.add_argument("--netns", help="/run/netns/<name> of the real node")
    real.add_argument("--node-name", help="the real node's name")
    real.add_argument("--api-server", help="https://127.0.0.1:<port>")
    real.add_argument("--ca", help="the API server's CA certificate")
    real.add_argument("--cert", help="a client certificate that may read Services, EndpointSlices")
    real.add_argument("--key", help="its key")
    args = parser.parse_args()
    real_node = None
    if args.netns:
        context = ssl.create_default_context(cafile=args.ca)
        context.load_cert_chain(args.cert, args.key)
        real_node = RealNode(args.netns, args.node_name, args.api_server, context)
    handler = _handler(_State(), real_node)
    ThreadingHTTPServer(("127.0.0.1", args.port), handler).serve_forever()


if __name__ == "__main__":
    main()
