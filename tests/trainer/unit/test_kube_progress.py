"""The progress reporter's API server target outside a pod (kube_progress.py)."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from llmtrain_trainer import kube_progress
from llmtrain_trainer.metrics import MetricsRecord

from tests.support.cluster import pki


class _StatusServer(http.server.BaseHTTPRequestHandler):
    """Answers every PATCH 200 and records its path and bearer token."""

    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def patched_bodies(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """An API server stand-in on 127.0.0.1 the reporter patches; yields the bodies it received."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BodyServer)
    _BodyServer.bodies = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(kube_progress.API_SERVER_ENV, f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv(kube_progress.API_TOKEN_ENV, "t")
    try:
        yield _BodyServer.bodies
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 whose certificate a private CA signed; its URL and the CA file."""
    ca = pki.CertificateAuthority(tmp_path / "pki")
    pair = ca.issue("server", common_name="127.0.0.1", hosts=("127.0.0.1",))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StatusServer)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    _StatusServer.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", ca.cert
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("with_ca", [True, False])
def test_reporter_outside_a_pod_verifies_the_api_server_with_the_ca_file_from_the_env(
    tls_server: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    with_ca: bool,
) -> None:
    url, ca_file = tls_server
    monkeypatch.setenv(kube_progress.API_SERVER_ENV, url)
    monkeypatch.setenv(kube_progress.API_TOKEN_ENV, "secret")
    if with_ca:
        monkeypatch.setenv(kube_progress.API_CA_FILE_ENV, str(ca_file))
    else:
        monkeypatch.delenv(kube_progress.API_CA_FILE_ENV, raising=False)
    target = kube_progress.ApiTarget.discover()
    assert target is not None
    assert target == kube_progress.ApiTarget(url.rstrip("/"), "secret", str(ca_file) if with_ca else None)

    sink = kube_progress.KubernetesProgressSink(target, "team", "job", interval=0.05, max_backoff=0.1)
    sink.emit(MetricsRecord("step", 1, 10, loss=2.0))
    sink.close(flush_timeout=5)
    if with_ca:
        assert (sink.patches_sent, sink.failures) == (1, 0)
        path = "/apis/llmtrain.dev/v1alpha1/namespaces/team/llmtrainingjobs/job/status"
        assert _StatusServer.seen == [(path, "Bearer secret")]
    else:  # the private CA is not among the system's: the certificate cannot be verified
        assert (sink.patches_sent, _StatusServer.seen) == (0, []) and sink.failures >= 1
        assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


class _BodyServer(http.server.BaseHTTPRequestHandler):
    """Answers every PATCH 200 and records its JSON body."""

    bodies: ClassVar[list[Any]] = []

    def do_PATCH(self) -> None:
        import json

        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


def test_the_pushed_exports_uri_reaches_status_progress_exported_to(
    tmp_path: Path, patched_bodies: list[Any]
) -> None:
    """checkpoint.exportTo's result: the driver patches status.progress.exportedTo, nothing else
    but the report time (a merge patch keeps the step, loss and checkpoint rank 0 reported)."""
    from tests.support.trainer import tiny_config

    config = tiny_config(tmp_path, "push", progress={"reportToKubernetes": True})
    kube_progress.report_export(config, "s3://models/tiny/v1", flush_timeout=5)
    (body,) = patched_bodies
    progress = body["status"]["progress"]
    assert progress.pop("updatedAt")
    assert progress == {"exportedTo": "s3://models/tiny/v1"}


def test_the_hub_commit_reaches_status_progress_pushed_to_hub_alone(
    tmp_path: Path, patched_bodies: list[Any]
) -> None:
    """checkpoint.pushToHub's result: status.progress.pushedToHub, and exportedTo left alone (a
    merge patch without it keeps what an earlier attempt reported)."""
    from tests.support.trainer import tiny_config

    commit = "https://huggingface.co/my-org/tiny/commit/0123abcd"
    config = tiny_config(tmp_path, "push", progress={"reportToKubernetes": True})
    kube_progress.report_export(config, hub_commit=commit, flush_timeout=5)
    kube_progress.report_export(config, flush_timeout=5)  # nothing pushed: no patch at all
    (body,) = patched_bodies
    progress = body["status"]["progress"]
    assert progress.pop("updatedAt")
    assert progress == {"pushedToHub": commit}
