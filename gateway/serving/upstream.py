"""One deployment's worker as the gateway calls it: `Upstream` (`post` for a whole answer, `open_stream` for an
SSE body), the one place where a worker is called over HTTP.

It owns the worker's URL (read at each call: a restarted worker may listen elsewhere), the timeouts, the
engine adapter's translation of the typed request (`backends.request`, every kind through the same door),
transport errors and the mapping of the worker's error answers to the gateway's family.

    Upstream.post(request)        translate → POST → 200: the JSON object | GatewayError
    Upstream.open_stream(request) translate → POST (streamed) → 200: the open response | GatewayError
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Literal

import httpx
import pydantic_core

from backends.base import UpstreamError
from backends.request import ENGINE_PATHS, AnyEngineRequest
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment
from gateway.lifecycle.workers import Worker, restarted_message

_JSON_HEADERS: list[tuple[str, str]] = [("content-type", "application/json")]

WORKER_EXTENSION = "voltgate.worker"
"""The worker a request goes to, on the httpx request (so a broken stream's error can name it)."""


def upstream_error_to_gateway(err: UpstreamError) -> GatewayError:
    """Map a worker's error to the gateway's family (one table for every engine)."""
    if err.code == "context_length_exceeded":
        return GatewayError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, err.message, param=err.param or "messages")
    if err.status == 400 or err.status == 422:
        return GatewayError(ErrorCode.INVALID_REQUEST, err.message, param=err.param)
    if err.status == 429:
        return GatewayError(ErrorCode.QUEUE_FULL, err.message, retry_after_s=5)
    if err.status == 503:
        return GatewayError(ErrorCode.WORKER_UNAVAILABLE, err.message, retry_after_s=5)
    return GatewayError(ErrorCode.UPSTREAM_ERROR, f"worker error ({err.status}): {err.message}")


def transport_error(exc: Exception, model: str) -> GatewayError:
    """A call that got no answer: a timeout (504-family, retry later) or a lost connection (503)."""
    if isinstance(exc, httpx.TimeoutException):
        return GatewayError(ErrorCode.UPSTREAM_TIMEOUT, f"model {model!r} did not answer in time", retry_after_s=5)
    worker: Worker | None = None
    with contextlib.suppress(RuntimeError):  # httpx raises where no request was attached to the error
        worker = exc.request.extensions.get(WORKER_EXTENSION) if isinstance(exc, httpx.RequestError) else None
    cause = type(exc).__name__
    message = restarted_message(model, cause) if worker is None else worker.connection_lost(cause)
    return GatewayError(ErrorCode.WORKER_UNAVAILABLE, message, retry_after_s=5)


UnansweredReason = Literal["connect", "reset", "lost", "not_ready"]
"""Why a worker answered nothing: no connection to it, the connection broke before the answer's headers (or,
unary, before its body ended), the worker declared lost while the call waited, or not ready when the call began."""


class Unanswered(GatewayError):
    """The worker answered nothing (`reason`): no status, no byte, so nothing of the request can have reached the
    client and the service may send it once more to another replica of the model (docs/replicas.md, "When a
    replica fails"). Raised only by `Upstream._send`: a worker's own error answer, a timeout once connected, or a
    stream that broke after its headers is a plain `GatewayError`."""

    def __init__(self, error: GatewayError, reason: UnansweredReason) -> None:
        super().__init__(error.code, error.message, param=error.param, retry_after_s=error.retry_after_s,
                         status=error.status)  # fmt: skip
        self.reason: UnansweredReason = reason


def unanswered_reason(exc: httpx.HTTPError) -> UnansweredReason | None:
    """The reason a transport error left the worker's answer unstarted, or None when it may have begun (a read
    timeout: the worker took the request and is slow, so sending it again would only run it twice)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "connect"
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return "reset"
    return None


class Upstream:
    """Calls one deployment's worker. Stateless between calls (the client's pool keeps the connections), so one
    per deployment serves every request to it concurrently."""

    def __init__(
        self,
        deployment: Deployment,
        client: httpx.AsyncClient,
        timeout: httpx.Timeout,
        *,
        read_s: Callable[[AnyEngineRequest, int], float] | None = None,
    ) -> None:
        self.deployment = deployment
        self._client = client
        self._timeout_ext = timeout.as_dict()
        self._read_s = read_s  # a call's longest silence, by its request and body bytes (`gateway.serving.silence`)
        self._urls: dict[str, httpx.URL] = {}  # by the worker's base URL + path: parsed once, not per request
        self._streams: weakref.WeakSet[httpx.Response] = weakref.WeakSet()  # open bodies, cut if the worker is lost
        self._watched: asyncio.Future[str] | None = None  # the lost signal `_cut_streams` waits on

    def _url(self, request: AnyEngineRequest) -> httpx.URL:
        """The worker's URL for `request`'s kind, parsed once: httpx would parse a URL string on every request,
        on the path to the first token. Kept by the base URL the worker has now (a restarted worker may listen
        elsewhere: a new entry; the stale ones are dropped once there are more than the paths)."""
        text = self.deployment.worker.base_url() + ENGINE_PATHS[request.kind]
        url = self._urls.get(text)
        if url is None:
            if len(self._urls) >= len(ENGINE_PATHS):
                self._urls.clear()
            url = self._urls[text] = httpx.URL(text)
        return url

    def _request(self, request: AnyEngineRequest) -> httpx.Request:
        """The worker call, built as an `httpx.Request` itself: the client's `build_request` merges its default
        headers, cookies and parameters on every call (about half the cost), none of which a worker reads."""
        url = self._url(request)
        # pydantic-core's encoder: the same compact UTF-8 bytes as `json.dumps(ensure_ascii=False)`, in one call
        # (a body cannot hold NaN: `gateway.protocol.json_body` refuses it)
        body = pydantic_core.to_json(self.deployment.adapter.translate_request(request), inf_nan_mode="null")
        worker = self.deployment.worker  # its headers: a cluster worker's launch secret; none locally
        headers = [*_JSON_HEADERS, *worker.headers.items()] if worker.headers else _JSON_HEADERS
        timeout = self._timeout_ext
        if self._read_s is not None:
            timeout = {**timeout, "read": self._read_s(request, len(body))}
        extensions = {"timeout": timeout, WORKER_EXTENSION: worker}
        return httpx.Request("POST", url, content=body, headers=headers, extensions=extensions)

    def _refused(self, status: int, content: bytes) -> GatewayError:
        return upstream_error_to_gateway(self.deployment.adapter.normalize_error(status, content))

    async def _send(
        self, request: AnyEngineRequest, lost: asyncio.Future[str] | None, *, stream: bool
    ) -> httpx.Response:
        """Send; a transport failure, or the worker declared lost before the answer (`lost`, its `lost_signal`
        when the call began), is the `GatewayError` that says so: `Unanswered` where the worker answered
        nothing (then another replica may take the request)."""
        worker = self.deployment.worker
        try:
            if lost is None:
                return await self._client.send(self._request(request), stream=stream)
            return await _unless_lost(self._client.send(self._request(request), stream=stream), lost)
        except httpx.HTTPError as exc:
            error, reason = transport_error(exc, self.deployment.name), unanswered_reason(exc)
            raise (error if reason is None else Unanswered(error, reason)) from None
        except WorkerLost as exc:
            error = GatewayError(ErrorCode.WORKER_UNAVAILABLE, worker.connection_lost(str(exc)), retry_after_s=5)
            raise Unanswered(error, "lost") from None
        except GatewayError as exc:  # `base_url`: the worker is not ready (it failed while the request queued)
            if exc.code is not ErrorCode.WORKER_UNAVAILABLE:
                raise
            raise Unanswered(exc, "not_ready") from None

    async def post(self, request: AnyEngineRequest) -> dict[str, Any]:
        """The worker's whole answer, a JSON object; raises `GatewayError` for every other outcome."""
        response = await self._send(request, self.deployment.worker.lost_signal(), stream=False)
        if response.status_code != 200:
            raise self._refused(response.status_code, response.content)
        try:
            data = response.json()
        except ValueError:
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "worker sent a body that is not JSON") from None
        if not isinstance(data, dict):
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "worker sent an unexpected body")
        return data

    async def open_stream(self, request: AnyEngineRequest) -> httpx.Response:
        """The worker's streamed answer, open with status 200 (the caller closes it); a refusal is read whole,
        closed and raised as `GatewayError`, before any byte reaches the client."""
        lost = self.deployment.worker.lost_signal()
        response = await self._send(request, lost, stream=True)
        if response.status_code != 200:
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            raise self._refused(response.status_code, content)
        self._cut_if_lost(response, lost)
        return response

    def _cut_if_lost(self, response: httpx.Response, lost: asyncio.Future[str] | None) -> None:
        """Keep an open body to cut (its socket shut) if the worker is declared lost: the relay's pending read
        then fails at once as a broken connection, its error frame naming the host. Costs nothing per chunk."""
        if lost is None:
            return
        self._streams.add(response)
        if lost is not self._watched:
            self._watched = lost
            lost.add_done_callback(lambda _: self._cut_streams())

    def _cut_streams(self) -> None:
        for response in list(self._streams):
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None  # asyncio's TransportSocket
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._streams.clear()


class WorkerLost(Exception):
    """The worker was declared lost while a call waited for its answer (the reason is the message)."""


async def _unless_lost(call: Coroutine[Any, Any, httpx.Response], lost: asyncio.Future[str]) -> httpx.Response:
    """`call`'s response, or `WorkerLost` as soon as `lost` resolves first (the call is cancelled)."""
    if lost.done():
        call.close()
        raise WorkerLost(lost.result())
    task = asyncio.ensure_future(call)
    waiting: set[asyncio.Future[Any]] = {task, lost}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise WorkerLost(lost.result())
