"""A stand-in for the Hugging Face Hub's HTTP API, on 127.0.0.1, for the checkpoint.pushToHub tests.

The tests have no network to huggingface.co, so the Hub is a stand-in that speaks its protocol:
this server implements the endpoints huggingface_hub 2.4's `HfApi.create_repo`, `create_branch`
and `upload_folder` call (read from its hf_api.py, _commit_api.py and lfs.py), keeps the
repositories in memory and records every request. Preupload answers "regular" for small files (they
come inline, base64, in the NDJSON commit) and "lfs" from `lfs_threshold` bytes on (the Hub's
rule is 10 MB or binary content; a test lowers it): those go through the Git LFS batch API, a PUT
of the bytes to the upload URL it hands out, the verify call, and the commit names them by sha256.
huggingface_hub takes that LFS path only with Xet off (HF_HUB_DISABLE_XET, or no hf_xet package);
hf_xet is installed (here and in the trainer image) and the push turns Xet off itself
(llmtrain_trainer.hubpush._lfs_only), so this is the path a real push takes. The Xet protocol is
not spoken here: a push that went to Xet fails on its first Xet request (a 404). A real Hub's
authorization, LFS rules and visibility are not modelled: the tests assert what reached the server
(token header, repository, files), not what the Hub would do.

    POST /api/repos/create                           {"name", "organization", "visibility"?}
    POST /api/models/<org>/<name>/branch/<branch>    {"startingPoint"?}
    POST /api/models/<org>/<name>/preupload/<rev>    {"files": [{"path", "sample", "size"}]}
    POST /<org>/<name>.git/info/lfs/objects/batch    {"operation": "upload", "objects": [{"oid", "size"}]}
    PUT  /lfs/upload/<oid>                           the object's bytes (the batch's upload href)
    POST /lfs/verify/<oid>                           {"oid", "size"} (the batch's verify href)
    POST /api/models/<org>/<name>/commit/<rev>       NDJSON: header, then "file" / "lfsFile" entries

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
_LFS_BATCH = re.compile(r"^/([^/]+/[^/]+)\.git/info/lfs/objects/batch$")
_LFS_OBJECT = re.compile(r"^/lfs/(upload|verify)/([0-9a-f]{64})$")
HUB_LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub's: a file of 10 MB or more is stored with LFS


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
        self.lfs_threshold = HUB_LFS_THRESHOLD
        self.lfs_objects: dict[str, bytes] = {}  # sha256 (hex) -> the bytes PUT to its upload URL
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
        if lfs := _LFS_BATCH.match(path):
            return self._lfs_batch(lfs.group(1), body)
        if lfs := _LFS_OBJECT.match(path):
            return self._lfs_object(method, lfs.group(1), lfs.group(2), body)
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
            modes = ["lfs" if f["size"] >= self.lfs_threshold else "regular" for f in files]
            return 200, {
                "files": [
                    {"path": f["path"], "uploadMode": mode, "shouldIgnore": False}
                    for f, mode in zip(files, modes, strict=True)
                ]
            }
        return self._commit(repo_id, repo, revision, body)

    def _lfs_batch(self, repo_id: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """Git LFS's batch API: an upload (and verify) URL for each object not stored yet."""
        if repo_id not in self.repos:
            return 404, {"message": "Repository not found"}
        request = json.loads(body)
        if request.get("operation") != "upload" or "basic" not in request.get("transfers", ["basic"]):
            return 422, {"message": "the stand-in Hub takes basic LFS uploads only"}
        objects = []
        for item in request["objects"]:
            entry: dict[str, Any] = {"oid": item["oid"], "size": item["size"]}
            if item["oid"] not in self.lfs_objects:
                entry["actions"] = {
                    "upload": {"href": f"{self.endpoint}/lfs/upload/{item['oid']}"},
                    "verify": {"href": f"{self.endpoint}/lfs/verify/{item['oid']}"},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}

    def _lfs_object(self, method: str, action: str, oid: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The upload URL (a PUT of the bytes, checked against their sha256) and the verify call."""
        if action == "upload" and method == "PUT":
            if hashlib.sha256(body).hexdigest() != oid:
                return 400, {"message": f"the uploaded bytes are not object {oid}"}
            self.lfs_objects[oid] = body
            return 200, {}
        if action == "verify" and method == "POST":
            stored = self.lfs_objects.get(oid)
            if stored is None or len(stored) != json.loads(body)["size"]:
                return 404, {"message": f"object {oid} was not uploaded"}
            return 200, {}
        return 405, {"message": f"{method} /lfs/{action}: not implemented by the stand-in Hub"}

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
            elif line["key"] == "lfsFile":
                value = line["value"]
                stored = self.lfs_objects.get(value["oid"])
                if value.get("algo") != "sha256" or stored is None or len(stored) != value["size"]:
                    return 422, {"error": f"{value['path']}: LFS object {value['oid']} was not uploaded"}
                tree[value["path"]] = stored
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

    def do_PUT(self) -> None:
        self._answer("PUT")

    def _body(self) -> bytes:
        """The request's body, sent whole (Content-Length) or chunked (a streamed file)."""
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after the chunk
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)

    def _answer(self, method: str) -> None:
        body = self._body()
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
