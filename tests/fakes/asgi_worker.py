"""FakeWorker: an in-process `gateway.lifecycle.workers.Worker` whose engine is a small ASGI app.

Stands for a real worker (`backends.llamacpp.worker`, LMDeploy's api_server) in unit tests of the service
layer, reached through `httpx.ASGITransport` instead of a socket. It records every body it receives (so a
test can check what the gateway sent: the one typed `EngineRequest`) and answers as told.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from backends.request import EngineRequest
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.policy import Backoff
from gateway.lifecycle.workers import LOCAL_WORDING, NO_HEADERS, WorkerStartError, WorkerState, restarted_message

BASE_URL = "http://fake-worker"


@dataclass
class Behaviour:
    """What the fake engine does with the next requests."""

    status: int = 200
    error: dict[str, Any] | None = None
    text: str = "Hello there"
    chunks: int = 3
    delay_s: float = 0.0
    choice: dict[str, Any] = field(default_factory=dict)  # merged into a non-streamed answer's choice
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (None: left out, as LMDeploy may)


@dataclass
class FakeEngine:
    behaviour: Behaviour = field(default_factory=Behaviour)
    received: list[EngineRequest] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = EngineRequest.model_validate_json(await request.body())  # what a real worker does first
        self.received.append(body)
        b = self.behaviour
        if b.status != 200:
            return JSONResponse(b.error or {"error": {"message": "refused", "code": None}}, status_code=b.status)
        if body.stream:
            return StreamingResponse(self._frames(body), media_type="text/event-stream")
        await asyncio.sleep(b.delay_s)
        return JSONResponse(_completion(b.text, b.choice) | {"usage": _usage(b, 2)})

    async def _frames(self, body: EngineRequest) -> AsyncIterator[bytes]:
        b = self.behaviour
        yield _frame({"role": "assistant", "content": ""})
        for i in range(b.chunks):
            await asyncio.sleep(b.delay_s)
            yield _frame({"content": f"{b.text}{i}"})
        yield _frame({}, "stop")
        if body.include_usage:
            usage = _usage(b, b.chunks)
            yield b"data: " + json.dumps({**_envelope("chat.completion.chunk"), "choices": [], "usage": usage}).encode()
            yield b"\n\n"
        yield b"data: [DONE]\n\n"


def _usage(b: Behaviour, completion: int) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": 4, "completion_tokens": completion, "total_tokens": 4 + completion}
    if b.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": b.cached_tokens}
    return usage


def _envelope(obj: str) -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": obj, "created": 1, "model": "fake"}


def _frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return b"data: " + json.dumps({**_envelope("chat.completion.chunk"), "choices": [choice]}).encode() + b"\n\n"


def _completion(text: str, extra: dict[str, Any]) -> dict[str, Any]:
    message = {"role": "assistant", "content": text, "refusal": None}
    return {
        **_envelope("chat.completion"),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop", **extra}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }


class FakeNetwork(httpx.AsyncBaseTransport):
    """The network between the gateway and several fake workers (replicas): each host an ASGI engine, or one
    that refuses connections (`refuse`) as a killed worker's port does, or drops them before any answer (`reset`)
    as a worker killed mid-request does. Stands for the sockets a real gateway reaches its workers through."""

    def __init__(self, engines: dict[str, FakeEngine]) -> None:
        self.engines = engines
        self.down: dict[str, type[httpx.TransportError]] = {}  # host → the error a call to it raises
        self.calls: list[str] = []  # the host of every call, in order
        self.breaking: set[str] = set()  # hosts whose streams break after their first frame

    def refuse(self, host: str) -> None:
        self.down[host] = httpx.ConnectError

    def reset(self, host: str) -> None:
        self.down[host] = httpx.RemoteProtocolError

    def break_after_first_frame(self, host: str) -> None:
        """Answer with the engine's headers and first SSE frame, then drop the connection (a worker killed
        while it streams)."""
        self.breaking.add(host)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.calls.append(host)
        if host in self.down:
            raise self.down[host]("connection refused or reset by the fake network", request=request)
        response = await httpx.ASGITransport(app=self.engines[host].app()).handle_async_request(request)
        if host not in self.breaking:
            return response
        first = (await response.aread()).split(b"\n\n")[0] + b"\n\n"
        return httpx.Response(response.status_code, headers=response.headers, stream=_Broken(first))


class _Broken(httpx.AsyncByteStream):
    def __init__(self, first: bytes) -> None:
        self.first = first

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        raise httpx.ReadError("connection reset mid-stream by the fake network")


class FakeWorker:
    """A `Worker` that is READY once started; `fail()` makes `base_url()` answer 503 like a crashed one. `url` is
    where it listens (a `FakeNetwork` host for replicas); `lost` is its `lost_signal` (resolve it to declare the
    worker lost while a call waits)."""

    wording = LOCAL_WORDING

    def __init__(self, name: str, url: str = BASE_URL) -> None:
        self.name = name
        self.url = url  # another engine's: a `FakeNetwork` host's, a socket server's (`tests.fakes.silent_engine`)
        self.lost: asyncio.Future[str] | None = None
        self.state = WorkerState.STOPPED
        self.restarts = 0
        self.last_error: str | None = None
        self.backoff = Backoff()  # counted by the residency: a fake never restarts itself
        self.pid: int | None = None
        self.successes = 0

    def start(self, *, retry: bool = False) -> None:
        del retry
        if self.state is not WorkerState.READY:
            self.state = WorkerState.READY

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        del timeout_s
        return self.state is WorkerState.READY

    async def ensure_ready(self, timeout_s: float | None = None, *, retry: bool = False) -> None:
        del timeout_s, retry
        self.start()

    async def await_ready(self, timeout_s: float | None = None) -> None:
        if not await self.wait_ready(timeout_s):
            raise WorkerStartError(f"{self.name} is {self.state.value}")

    def note_success(self) -> None:
        self.successes += 1

    headers = NO_HEADERS

    def lost_signal(self) -> asyncio.Future[str] | None:
        return self.lost

    def connection_lost(self, cause: str) -> str:
        return restarted_message(self.name, cause)

    def base_url(self) -> str:
        if self.state is WorkerState.READY:
            return self.url
        raise GatewayError(ErrorCode.WORKER_UNAVAILABLE, f"model {self.name!r} is {self.state.value}", retry_after_s=5)

    def fail(self, reason: str = "crashed") -> None:
        self.state = WorkerState.FAILED
        self.last_error = reason

    async def stop(self, grace_s: float = 10.0) -> None:
        del grace_s
        self.state = WorkerState.STOPPED
