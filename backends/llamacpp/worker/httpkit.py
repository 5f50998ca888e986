"""What the chat and the embed worker's HTTP surfaces share: errors, body parsing, the disconnect watcher.

    WorkerError(code, message, param)   code: backends.errors.ErrorCode (the gateway's codes): status and
                                        `type` come from its tables; `.response()` is OpenAI's error body
    parse_body(raw, Model, unions)      bytes -> a validated pydantic model, or a 400 naming the parameter
    param_path(loc)                     pydantic's error location as the client's path (`messages[0].content`)
    watch_disconnect(receive, on_gone)  while the block runs, a client that leaves calls `on_gone` at once
    until_disconnected(future, receive) the future's result, or None (the future cancelled) if the client left
    EventStream                         SSE response whose disconnect cancels the request even mid-wait
    WorkerApp, model_list, loading, client_closed

Starlette is the only HTTP framework here; the worker's routes never see pydantic's or JSON's exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from backends.errors import STATUS, ErrorCode, error_type

B = TypeVar("B", bound=BaseModel)
T = TypeVar("T")

# What nginx logs for a client that closed the connection before the answer: nobody reads it, but the worker's
# own access log (and a test's ASGI client) sees that the request ended that way rather than with a 200.
CLIENT_CLOSED_STATUS = 499


class WorkerError(Exception):
    """A request the worker cannot serve: `code` decides the status and OpenAI `type`, as at the gateway."""

    def __init__(self, code: ErrorCode, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    @property
    def status(self) -> int:
        return STATUS[self.code]

    @property
    def type(self) -> str:
        return error_type(self.code)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code.value}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def invalid(message: str, param: str | None = None) -> WorkerError:
    """A 400 for a request that can never succeed as sent."""
    return WorkerError(ErrorCode.INVALID_REQUEST, message, param=param)


def loading() -> WorkerError:
    """The 503 every route but /health answers until the model is loaded."""
    return WorkerError(ErrorCode.WORKER_LOADING, "the model is still loading")


def client_closed() -> Response:
    return Response(status_code=CLIENT_CLOSED_STATUS)


def param_path(loc: Sequence[int | str]) -> str | None:
    """pydantic's error location as the client's parameter path (`input[2]`, `messages[0].content`), with the
    labels pydantic adds for union branches (`str`, `list[int]`, a tagged union's tag) dropped."""
    out = ""
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif item not in ("str", "int") and "[" not in item:
            out += ("." if out else "") + item
    return out or None


def parse_body(raw: bytes, model_type: type[B], unions: dict[str, str] | None = None) -> B:
    """Decode and validate a request body, or raise a 400 `WorkerError` naming the first bad parameter.

    `unions` maps a union-typed field to the message for a value none of its forms accepts (pydantic's own
    errors for it are one per form, none of which says what was expected).
    """
    try:
        return model_type.model_validate_json(raw)
    except ValidationError as exc:
        raise _refusal(exc, unions or {}) from None


def _refusal(exc: ValidationError, unions: dict[str, str]) -> WorkerError:
    first = exc.errors(include_url=False)[0]
    kind, loc = first["type"], first["loc"]
    if kind == "json_invalid":
        return WorkerError(ErrorCode.INVALID_JSON, f"invalid JSON body: {first['msg']}")
    if not loc and kind in ("model_type", "model_attributes_type", "dict_type"):
        return invalid("the request body must be a JSON object")
    param = param_path(loc)
    field = loc[0] if loc else None
    if isinstance(field, str) and field in unions and kind != "missing":
        return invalid(unions[field], param=field)
    if kind == "missing":
        return invalid(f"missing required parameter: {param}", param=param)
    return invalid(f"{param}: {first['msg']}" if param else first["msg"], param=param)


async def _until_gone(receive: Receive, on_gone: Callable[[], object]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    on_gone()


@contextlib.asynccontextmanager
async def watch_disconnect(receive: Receive, on_gone: Callable[[], object]) -> AsyncIterator[None]:
    """While the block runs, read the request's ASGI channel: `http.disconnect` calls `on_gone` at once (the
    block is not interrupted; `on_gone` cancels what it waits for). The worker's one disconnect watcher."""
    watcher = asyncio.create_task(_until_gone(receive, on_gone))
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def until_disconnected(future: asyncio.Future[T], receive: Receive) -> T | None:
    """The future's result (or its exception), or None if the client left first: the future is then
    cancelled, which tells its producer to skip it."""
    async with watch_disconnect(receive, future.cancel):
        await asyncio.wait({future})
    return None if future.cancelled() else future.result()


class EventStream(StreamingResponse):
    """Server-sent events; a client that goes away calls `on_disconnect` at once, even while no frame is due.
    `on_disconnect` also runs when the stream ends (it must be a no-op for a finished request)."""

    def __init__(self, frames: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        super().__init__(
            frames,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
        self._frames = frames
        self._on_disconnect = on_disconnect

    async def __call__(self, _scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            async with watch_disconnect(receive, self._on_disconnect):
                async for frame in self._frames:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # uvicorn's ClientDisconnected on a write after the peer left
            pass
        finally:
            self._on_disconnect()  # a no-op once finished; otherwise (disconnect, task cancelled) it stops it


def model_list(model_name: str, created: int, reasoning_format: str | None = None) -> JSONResponse:
    """/v1/models: the one model this worker serves; a chat worker adds `reasoning_format`, the reasoning
    syntax it found in the chat template ("deepseek", "harmony" or "none": `reasoning.ReasoningFormat`)."""
    model: dict[str, object] = {"id": model_name, "object": "model", "created": created, "owned_by": "voltgate"}
    if reasoning_format is not None:
        model["reasoning_format"] = reasoning_format
    return JSONResponse({"object": "list", "data": [model]})


@dataclass(frozen=True)
class WorkerApp:
    """The ASGI app and its shutdown hook (`begin_shutdown` is safe to call from a signal handler)."""

    asgi: Starlette
    begin_shutdown: Callable[[], None]
