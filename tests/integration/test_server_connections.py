"""The gateway's HTTP server on real loopback sockets: header read timeout, idle keep-alive timeout, the limit
on open connections per client address, and a 500 that keeps its keep-alive connection usable.

The server is the real `create_app` (its one model refused at placement: no worker needed) under uvicorn with
`gateway.serving.connections.server_options`, in a thread, with short timeouts; every socket has a timeout, so a
failure ends the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from gateway.app import create_app
from gateway.config import Config
from gateway.ops.auth import hash_key
from gateway.ops.metrics import Metrics
from gateway.serving.connections import ClientConnections, server_options
from tests.conftest import free_port

pytestmark = pytest.mark.integration

SOCKET_TIMEOUT_S = 10.0
KEY = "vg-test-key"
BIG = b" " * 256 * 1024  # more than a socket buffer holds: unread when the server answers
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@contextlib.contextmanager
def serving(
    tmp_path: Path, *, header_timeout_s: float = 0.5, idle_timeout_s: float = 1.0, max_per_client: int | None = 8,
    body_timeout_s: float = 60.0, metrics: Metrics | None = None, keyed: bool = False,
) -> Iterator[int]:  # fmt: skip
    auth = {"keys_env": None, "keys": [{"id": "k", "sha256": hash_key(KEY)}] if keyed else []}
    server = {"data_dir": str(tmp_path / "d"), "body_timeout_s": body_timeout_s}
    cfg = Config.model_validate(
        {"server": server, "auth": auth, "models": [{"name": "m", "sources": [{"gguf": "/x.gguf"}]}]}
    )
    app = create_app(cfg, [], refused={"m": "no"}, metrics=metrics)

    async def boom() -> None:
        raise RuntimeError("a bug")

    async def slow() -> dict[str, bool]:
        await asyncio.sleep(header_timeout_s * 3)
        return {"ok": True}

    app.add_api_route("/v1/boom", boom, methods=["GET"])
    app.add_api_route("/v1/slow", slow, methods=["GET"])
    port = free_port()
    connections = ClientConnections(max_per_client, header_timeout_s)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False,
                            **server_options(connections, idle_timeout_s))  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S)
    sock.settimeout(SOCKET_TIMEOUT_S)
    return sock


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body: status, headers (lower-case names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes `sock` (reads EOF), reading and dropping anything it sends."""
    started = time.monotonic()
    while sock.recv(65536):
        pass
    return time.monotonic() - started


def test_a_silent_connection_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    with serving(tmp_path) as port, connect(port) as sock:
        assert 0.3 <= closed_after(sock) < SOCKET_TIMEOUT_S


def test_half_sent_headers_are_closed_after_the_header_timeout(tmp_path: Path) -> None:
    with serving(tmp_path) as port, connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n")
        assert closed_after(sock) < SOCKET_TIMEOUT_S


def test_headers_sent_slowly_within_the_timeout_and_a_long_request_are_served(tmp_path: Path) -> None:
    with serving(tmp_path) as port, connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.2)
        sock.sendall(b"Host: test\r\n\r\n")
        assert read_response(sock)[0] == 200
        sock.sendall(request("/v1/slow"))  # runs three header timeouts long: the timeout is for headers only
        status, _, body = read_response(sock)
        assert status == 200 and body == b'{"ok":true}'


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    with serving(tmp_path, header_timeout_s=5.0, idle_timeout_s=0.5) as port, connect(port) as sock:
        sock.sendall(request("/health"))
        assert read_response(sock)[0] == 200
        assert 0.3 <= closed_after(sock) < 5.0


def test_the_next_requests_half_sent_headers_are_closed_too(tmp_path: Path) -> None:
    with serving(tmp_path, header_timeout_s=0.5, idle_timeout_s=30.0) as port, connect(port) as sock:
        sock.sendall(request("/health"))
        assert read_response(sock)[0] == 200
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # stops the idle timer; the header timer takes over
        assert closed_after(sock) < 5.0


def test_connections_past_the_per_client_limit_get_a_429_and_the_limit_frees_up(tmp_path: Path) -> None:
    with serving(tmp_path, header_timeout_s=30.0, idle_timeout_s=30.0, max_per_client=4) as port:
        held = [connect(port) for _ in range(4)]
        try:
            for sock in held:  # all four are served
                sock.sendall(request("/health"))
                assert read_response(sock)[0] == 200
            with connect(port) as extra:
                status, headers, body = read_response(extra)
                assert status == 429 and headers["connection"] == "close" and headers["retry-after"] == "1"
                assert b'"code": "rate_limit_exceeded"' in body and b"too many open connections" in body
                assert closed_after(extra) < SOCKET_TIMEOUT_S
            held.pop().close()
            deadline = time.monotonic() + 5
            while True:  # the server sees the close shortly after
                with connect(port) as again:
                    again.sendall(request("/health"))
                    if read_response(again)[0] == 200:
                        break
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            for sock in held:
                sock.close()


def test_a_500_keeps_the_keep_alive_connection_usable(tmp_path: Path) -> None:
    with serving(tmp_path, header_timeout_s=5.0, idle_timeout_s=5.0) as port, connect(port) as sock:
        sock.sendall(request("/v1/boom"))
        status, headers, body = read_response(sock)
        assert status == 500 and headers["x-request-id"] and headers.get("connection") != "close"
        assert b'"code":"internal_error"' in body
        sock.sendall(request("/health"))
        assert read_response(sock)[0] == 200


def chat_head(length: int | None, *, key: str | None = None) -> bytes:
    """A chat POST's request line and headers: `Content-Length: length`, or chunked when None."""
    framing = "transfer-encoding: chunked" if length is None else f"content-length: {length}"
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\ncontent-type: application/json\r\n{auth}{framing}"
    return (head + "\r\n\r\n").encode()


def count(metrics: Metrics, status: int) -> float:
    return sum(s.value for family in metrics.registry.collect() if family.name == "voltgate:requests"
               for s in family.samples if s.name.endswith("_total") and s.labels["status"] == str(status))  # fmt: skip


@pytest.mark.parametrize("body", [b'5\r\n{"mod\r\n', CHAT[:20]], ids=["chunked-without-end", "short-content-length"])
def test_a_body_that_never_ends_gets_408_and_is_closed(tmp_path: Path, body: bytes) -> None:
    metrics = Metrics(gpu=False)
    with serving(tmp_path, header_timeout_s=5.0, body_timeout_s=0.5, metrics=metrics) as port, connect(port) as sock:
        sock.sendall(chat_head(None if body.startswith(b"5") else len(CHAT)) + body)
        status, headers, payload = read_response(sock)
        assert status == 408 and headers["connection"] == "close" and headers["x-request-id"], payload
        assert b'"code":"request_timeout"' in payload
        assert closed_after(sock) < SOCKET_TIMEOUT_S
    assert count(metrics, 408) == 1


def test_a_client_leaving_mid_body_is_a_499_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics(gpu=False)
    with serving(tmp_path, header_timeout_s=5.0, body_timeout_s=30.0, metrics=metrics) as port:
        for _ in range(3):
            with connect(port) as sock:
                sock.sendall(chat_head(len(CHAT)) + CHAT[:10])
                time.sleep(0.1)
        deadline = time.monotonic() + 10
        while count(metrics, 499) < 3:
            assert time.monotonic() < deadline, "the abandoned bodies were not accounted"
            time.sleep(0.05)
    assert count(metrics, 500) == 0
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert metrics.activity.errors() == []  # not on the status page's recent errors


def test_the_key_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    with serving(tmp_path, header_timeout_s=5.0, body_timeout_s=30.0, keyed=True) as port, connect(port) as sock:
        sock.sendall(chat_head(1_000_000, key="wrong"))  # a body announced, never sent
        status, headers, payload = read_response(sock)  # answered now, not after the body timeout
        assert status == 401 and headers["connection"] == "close", payload
        assert closed_after(sock) < SOCKET_TIMEOUT_S


def test_refused_connections_all_read_their_429(tmp_path: Path) -> None:
    """Each refused client sends its request at once, as a real one does: the answer comes before any reset."""
    with serving(tmp_path, header_timeout_s=30.0, idle_timeout_s=30.0, max_per_client=2) as port:
        held = [connect(port) for _ in range(2)]
        try:
            for _ in range(40):
                with connect(port) as extra:
                    with contextlib.suppress(OSError):  # a body still unread when the server closes
                        extra.sendall(chat_head(len(BIG)) + BIG)
                    status, _, body = read_response(extra)
                    assert status == 429 and b"too many open connections" in body
        finally:
            for sock in held:
                sock.close()


@pytest.mark.parametrize("what", ["header", "headers", "request-line"])
def test_requests_the_server_cannot_parse_get_a_400_envelope(tmp_path: Path, what: str) -> None:
    big = "x" * (1 << 20)
    raw = {
        "header": f"GET /health HTTP/1.1\r\nHost: test\r\nx-big: {big}\r\n\r\n",
        "headers": "GET /health HTTP/1.1\r\nHost: test\r\n" + f"x-h: {'y' * 100}\r\n" * 10_000 + "\r\n",
        "request-line": f"GET /{big} HTTP/1.1\r\nHost: test\r\n\r\n",
    }[what].encode()
    with serving(tmp_path, header_timeout_s=5.0) as port, connect(port) as sock:
        with contextlib.suppress(OSError):  # the server may shut its side before all of it is sent
            sock.sendall(raw)
        status, headers, body = read_response(sock)
        assert status == 400 and headers["content-type"] == "application/json" and headers["x-request-id"]
        assert b'"type": "invalid_request_error"' in body
