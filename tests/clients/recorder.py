"""A logging reverse proxy that records what real clients (Codex CLI, Claude Code) send and get back.

Standard library only, so it runs under any Python: `python -m tests.clients.recorder --listen PORT
--upstream http://127.0.0.1:GATEWAY --out FILE.jsonl`. Each exchange is one JSON line: method, path,
request headers (secrets masked), the request body (JSON when it parses), the response status, headers and
body (an SSE stream as its list of events). Responses are relayed as they arrive (streams stay streams).
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

_SECRET_HEADERS = frozenset({"authorization", "x-api-key", "cookie"})
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """An SSE body as a list of `{"event"?, "data"}` (data parsed as JSON where it is JSON; comments kept)."""
    events: list[dict[str, Any]] = []
    for block in raw.decode("utf-8", "replace").replace("\r\n", "\n").split("\n\n"):
        event: dict[str, Any] = {}
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith(":"):
                event.setdefault("comment", line[1:].strip())
            elif line.startswith("event:"):
                event["event"] = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if data:
            text = "\n".join(data)
            try:
                event["data"] = json.loads(text)
            except ValueError:
                event["data"] = text
        if event:
            events.append(event)
    return events


def _body(raw: bytes, content_type: str) -> Any:
    if "text/event-stream" in content_type:
        return sse_events(raw)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode("utf-8", "replace")


class Recorder:
    """Where exchanges go: appended as JSON lines under a lock. `scripted` replies, taken in order by the
    first POSTs to their path, answer instead of the upstream (an SSE body): how a tool round trip is recorded
    with a model too small to call tools on cue; the client's requests are what the fixtures keep."""

    def __init__(self, out: Path, upstream: str, scripted: list[tuple[str, bytes]] | None = None) -> None:
        self.out = out
        self.upstream = urlsplit(upstream)
        self.scripted = list(scripted or ())
        self._lock = threading.Lock()

    def script_for(self, path: str) -> bytes | None:
        with self._lock:
            for i, (prefix, body) in enumerate(self.scripted):
                if path.startswith(prefix):
                    del self.scripted[i]
                    return body
        return None

    def write(self, exchange: dict[str, Any]) -> None:
        with self._lock, self.out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(exchange, ensure_ascii=False) + "\n")


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _relay(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            scripted = recorder.script_for(self.path) if self.command == "POST" else None
            if scripted is not None:
                self._answer(raw, scripted)
                return
            up = recorder.upstream
            conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port or 80, timeout=900)
            conn.request(self.command, self.path, body=raw, headers=headers)
            resp = conn.getresponse()
            self.send_response(resp.status)
            content_type = resp.getheader("content-type") or ""
            for key, value in resp.getheaders():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            received = bytearray()
            while chunk := resp.read1(65536):
                received += chunk
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            conn.close()
            recorder.write(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": {
                        k.lower(): ("***" if k.lower() in _SECRET_HEADERS else v) for k, v in self.headers.items()
                    },
                    "body": _body(raw, self.headers.get("content-type") or "application/json"),
                    "status": resp.status,
                    "response_headers": dict(resp.getheaders()),
                    "response": _body(bytes(received), content_type),
                }
            )

        def _answer(self, raw: bytes, body: bytes) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            recorder.write({"method": self.command, "path": self.path, "scripted": True,
                            "headers": {k.lower(): ("***" if k.lower() in _SECRET_HEADERS else v)
                                        for k, v in self.headers.items()},
                            "body": _body(raw, "application/json"), "status": 200,
                            "response": sse_events(body)})  # fmt: skip

        do_GET = do_POST = do_DELETE = do_HEAD = _relay

    return Handler


def serve(listen_port: int, upstream: str, out: Path) -> ThreadingHTTPServer:
    """A started proxy (in a daemon thread) on 127.0.0.1:`listen_port`; `shutdown()` stops it."""
    server = ThreadingHTTPServer(("127.0.0.1", listen_port), _handler(Recorder(out, upstream)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--script", nargs=2, action="append", metavar=("PATH", "SSE_FILE"), default=[],
                        help="answer the first POST to PATH with this SSE body (repeatable, in order)")  # fmt: skip
    args = parser.parse_args()
    scripted = [(path, Path(file).read_bytes()) for path, file in args.script]
    server = ThreadingHTTPServer(("127.0.0.1", args.listen), _handler(Recorder(args.out, args.upstream, scripted)))
    server.serve_forever()


if __name__ == "__main__":
    main()
