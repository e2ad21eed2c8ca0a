"""A stand-in for the Hugging Face Hub's HTTP API, on 127.0.0.1, for the checkpoint.pushToHub tests.

The tests have no network to huggingface.co, so the push is tested only up to the request: this
server implements just the endpoints huggingface_hub 2.4's `HfApi.create_repo`, `create_branch`
and `upload_folder` call (read from its hf_api.py and _commit_api.py), keeps the repositories in
memory and records every request. It answers every file's preupload with the "regular" upload mode,
so the files come inline (base64) in the NDJSON commit; the LFS/Xet upload path of large files is
not covered. A real Hub's authorization, LFS rules and visibility are not modelled: the tests
assert what reached the server (token header, repository, files), not what the Hub would do.

    POST /api/repos/create                           {"name", "organization", "visibility"?}
    POST /api/models/<org>/<name>/branch/<branch>    {"startingPoint"?}
    POST /api/models/<org>/<name>/preupload/<rev>    {"files": [{"path", "sample", "size"}]}
    POST /api/models/<org>/<name>/commit/<rev>       NDJSON: header, then one "file" per file

`fail(prefix, status)` makes the next request whose path starts with `prefix` answer `status`.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

_REPO_PATH = re.compile(r"^/api/models/([^/]+/[^/]+)/(branch|preupload|commit)/(.+)$")


@dataclass
class Request:
    method: str
    path: str
    authorization: str | None
    body: bytes


@dataclass
class Repo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: list[tuple[str, str, str]] = field(default_factory=list)  # (branch, sha, summary)


class FakeHub:
    """The server's state: repositories, recorded requests and queued failures."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.endpoint = ""
        self._failures: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def fail(self, prefix: str, status: int) -> None:
        with self._lock:
            self._failures.append((prefix, status))

    def _take_failure(self, path: str) -> int | None:
        with self._lock:
            for index, (prefix, status) in enumerate(self._failures):
                if path.startswith(prefix):
                    del self._failures[index]
                    return status
        return None

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The status and JSON answer for one request."""
        if (status := self._take_failure(path)) is not None:
            return status, {"error": f"injected failure {status}"}
        if method == "POST" and path == "/api/repos/create":
            data = json.loads(body)
            repo_id = f"{data['organization']}/{data['name']}"
            url = f"{self.endpoint}/{repo_id}"
            if repo_id in self.repos:
                return 409, {"error": "You already created this model repo", "url": url}
            self.repos[repo_id] = Repo(private=data.get("visibility") == "private")
            return 200, {"url": url, "name": repo_id}
        match = _REPO_PATH.match(path)
        if method != "POST" or match is None:
            return 404, {"error": f"{method} {path}: not implemented by the stand-in Hub"}
        repo_id, action, revision = match.group(1), match.group(2), unquote(match.group(3))
        repo = self.repos.get(repo_id)
        if repo is None:
            return 404, {"error": "Repository not found"}
        if action == "branch":
            if revision in repo.branches:
                return 409, {"error": "Reference already exists"}
            start = (json.loads(body) if body else {}).get("startingPoint") or "main"
            repo.branches[revision] = dict(repo.branches[start])
            return 200, {}
        if revision not in repo.branches:
            return 404, {"error": f"Revision {revision} not found"}
        if action == "preupload":
            files = json.loads(body)["files"]
            return 200, {
                "files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            }
        return self._commit(repo_id, repo, revision, body)

    def _commit(self, repo_id: str, repo: Repo, branch: str, body: bytes) -> tuple[int, dict[str, Any]]:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        tree = dict(repo.branches[branch])
        for line in lines:
            if line["key"] == "file":
                value = line["value"]
                if value.get("encoding") != "base64":
                    return 400, {"error": "the stand-in Hub takes base64 file entries only"}
                tree[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] != "header":
                return 400, {"error": f"commit entry {line['key']} not implemented by the stand-in Hub"}
        repo.branches[branch] = tree
        sha = hashlib.sha1(body + str(len(repo.commits)).encode()).hexdigest()
        repo.commits.append((branch, sha, header["summary"]))
        return 200, {"commitUrl": f"{self.endpoint}/{repo_id}/commit/{sha}", "commitOid": sha}


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: FakeHub

    def do_POST(self) -> None:
        self._answer("POST")

    def do_GET(self) -> None:
        self._answer("GET")

    def _answer(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        self.hub.requests.append(Request(method, path, self.headers.get("Authorization"), body))
        status, answer = self.hub.handle(method, path, body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read `requests`
        pass


@contextmanager
def fake_hub() -> Iterator[FakeHub]:
    """A stand-in Hub on 127.0.0.1 (a free port), stopped on exit; `.endpoint` is its URL."""
    hub = FakeHub()
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
