"""The operator's API client: one pooled connection per handler thread; every failure to get an
answer from the API server is an ApiError the retry paths know."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client, config
from llmtrain.operator.election import Election, release
from llmtrain.operator.kube import RESOURCES, ApiError, Kube


def test_the_connection_pool_matches_the_handler_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_in_a_pod() -> None:
        raise config.ConfigException("not in a pod")

    monkeypatch.setattr(config, "load_incluster_config", not_in_a_pod)
    monkeypatch.setattr(config, "load_kube_config", lambda: None)

    kube = Kube.from_environment(connections=24)

    assert kube.api.configuration.connection_pool_maxsize == 24


def _kube_at(url: str) -> Kube:
    configuration = client.Configuration(host=url)
    configuration.retries = 0  # one attempt: the error, not urllib3's retry loop, is under test
    return Kube(client.ApiClient(configuration))


@contextlib.contextmanager
def _server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A one-connection-at-a-time TCP server that reads a request and answers with `answer`."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


def _html_502(conn: socket.socket) -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    conn.sendall(
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
        + f"Content-Length: {len(page)}\r\nConnection: close\r\n\r\n".encode()
        + page
    )


def _cut_off_mid_body(conn: socket.socket) -> None:
    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"kind"')


def _reset(conn: socket.socket) -> None:
    # SO_LINGER 0: close() sends a TCP RST instead of a FIN.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _html_200(conn: socket.socket) -> None:
    page = b"<html>captive portal</html>"
    conn.sendall(
        b"HTTP/1.1 200 OK\r\n" + f"Content-Length: {len(page)}\r\nConnection: close\r\n\r\n".encode() + page
    )


def test_an_unreachable_api_server_is_a_transient_connection_error() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()

    with pytest.raises(ApiError) as caught:
        _kube_at(f"http://127.0.0.1:{port}").get(RESOURCES[("v1", "ConfigMap")], "ns", "cm")

    assert (caught.value.status, caught.value.reason) == (0, "ConnectionError")
    assert caught.value.transient


@pytest.mark.parametrize("answer", [_cut_off_mid_body, _reset], ids=["cut-off-mid-body", "reset"])
def test_a_connection_broken_mid_answer_is_a_transient_connection_error(
    answer: Callable[[socket.socket], None],
) -> None:
    with _server(answer) as url, pytest.raises(ApiError) as caught:
        _kube_at(url).get(RESOURCES[("v1", "ConfigMap")], "ns", "cm")

    assert (caught.value.status, caught.value.reason) == (0, "ConnectionError")
    assert caught.value.transient


def test_a_proxys_html_502_is_an_api_error_with_its_status_and_page() -> None:
    with _server(_html_502) as url, pytest.raises(ApiError) as caught:
        _kube_at(url).get(RESOURCES[("v1", "ConfigMap")], "ns", "cm")

    assert (caught.value.status, caught.value.reason) == (502, "Bad Gateway")
    assert "502 Bad Gateway" in caught.value.message
    assert caught.value.transient


def test_a_2xx_that_is_not_json_is_a_transient_error_not_a_decode_crash() -> None:
    with _server(_html_200) as url, pytest.raises(ApiError) as caught:
        _kube_at(url).get(RESOURCES[("v1", "ConfigMap")], "ns", "cm")

    assert (caught.value.status, caught.value.reason) == (0, "InvalidResponse")
    assert caught.value.transient


def test_releasing_the_lease_with_the_api_server_unreachable_only_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    unreachable = client.Configuration(host=f"http://127.0.0.1:{port}")
    unreachable.retries = 0
    monkeypatch.setattr(client.Configuration, "get_default_copy", lambda: unreachable)

    release(Election("llmtrain-operator", "ns"), "me")

    assert "could not release the lease" in caplog.text
