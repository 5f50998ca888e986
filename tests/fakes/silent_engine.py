"""SilentEngine: a socket server that accepts a worker call, reads it whole, then sends nothing more.

Stands for a worker whose engine is stuck behind a live HTTP server, and in particular for LMDeploy's
api_server (TurboMind), which sends nothing on a stream before its first token: TurboMind needs a GPU, so the
gateway's silence bound for it is tested against this stand-in. A stream gets the 200 headers of an SSE body
and then silence (as TurboMind while it prefills); a non-streamed call gets nothing at all. Real sockets, so
httpx's read timeouts apply (`httpx.ASGITransport` enforces none).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from types import TracebackType

SSE_HEADERS = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class SilentEngine:
    """`async with SilentEngine() as engine:` serves on `engine.url` until the block ends; `calls` counts the
    calls it read."""

    def __init__(self) -> None:
        self.calls = 0
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []  # connections kept open, silent, until the end

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> SilentEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        for writer in self._held:
            writer.close()
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._held.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
            body = json.loads(await reader.readexactly(length))
            self.calls += 1
            if body.get("stream"):
                writer.write(SSE_HEADERS)
                await writer.drain()
            await reader.read()  # silent until the gateway gives up and closes the connection
