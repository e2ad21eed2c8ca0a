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
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_HOST = re.compile(r"^(?P<cluster>[a-z0-9-]+)-head-svc\.(?P<namespace>[a-z0-9-]+)\.svc")
_JOB = re.compile(r"^/api/jobs/(?P<id>[^/]+)(?P<stop>/stop)?/?$")


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


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
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
    args = parser.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), _handler(_State())).serve_forever()


if __name__ == "__main__":
    main()
