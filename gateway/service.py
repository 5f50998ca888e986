"""The request flow for inference endpoints: resolve → authorise → admit → relay → account.

route ─▶ Service.handle(kind, request, principal)
           ├─ registry.resolve(model)             404 model_not_found
           ├─ principal.check_model / admit       403 / 429
           ├─ capability check                    400 names the parameter
           ├─ worker.base_url()                   503 + Retry-After while loading/restarting
           ├─ admission.acquire()                 429 + Retry-After when the queue is full
           └─ relay (stream | JSON)               worker errors normalised by the engine's adapter
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backends.base import RequestKind
from gateway.auth import Principal
from gateway.config import ServerSettings
from gateway.deployments import Deployment, Registry
from gateway.errors import ErrorCode, GatewayError, sse_error_frame
from gateway.metrics import Metrics
from gateway.protocol import ChatCompletion, Completion, InferenceRequest
from gateway.relay import (
    DONE_FRAME,
    SSE_HEADERS,
    RelayResponse,
    StreamStats,
    relay_stream,
    sse_frames,
    transport_error,
    upstream_error_to_gateway,
)

access_log = logging.getLogger("voltgate.access")

PATHS = {RequestKind.CHAT: "/v1/chat/completions", RequestKind.COMPLETION: "/v1/completions",
         RequestKind.EMBEDDING: "/v1/embeddings"}  # fmt: skip


@dataclass
class _StreamState:
    """What a streamed request's close handler needs to know about how far it got."""

    admitted_at: float | None = None
    upstream: httpx.Response | None = None
    status: int = 200
    closed: bool = False


@dataclass
class RequestContext:
    request_id: str
    principal: Principal
    started: float
    prompt: Any = None  # what the client sent, kept only when `server.log_prompts` is on


class Service:
    def __init__(self, registry: Registry, client: httpx.AsyncClient, settings: ServerSettings, metrics: Metrics):
        self.registry = registry
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self._upstream_timeout = httpx.Timeout(connect=5.0, read=settings.upstream_timeout_s, write=30.0, pool=30.0)

    # -- entry point ------------------------------------------------------------------------------------
    async def handle(
        self, kind: RequestKind, parsed: InferenceRequest, request: Request, ctx: RequestContext
    ) -> Response:
        if self.settings.log_prompts:
            sent = parsed.engine_body()
            ctx.prompt = sent.get("messages", sent.get("prompt", sent.get("input")))
        deployment = self.registry.resolve(parsed.model)
        model = deployment.name
        try:
            ctx.principal.check_model(model, deployment.aliases)
            self._check_capabilities(kind, parsed, deployment)
            deployment.worker.base_url()  # fail fast with 503 while the worker loads or restarts
            ctx.principal.admit()
        except GatewayError as exc:
            self.metrics.rejections.labels(model, exc.code.value).inc()
            self._account(ctx, model, kind, exc.status, None)
            raise
        body = deployment.adapter.translate_request(kind, self._engine_body(parsed, deployment))
        if parsed.stream:
            return await self._stream(kind, parsed, body, deployment, ctx)
        return await self._unary(kind, body, deployment, request, ctx)

    # -- checks -----------------------------------------------------------------------------------------
    def _check_capabilities(self, kind: RequestKind, parsed: InferenceRequest, deployment: Deployment) -> None:
        caps = deployment.adapter.capabilities
        if kind not in caps.kinds:
            raise GatewayError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                f"model {deployment.name!r} ({deployment.plan.engine.value}) does not serve {PATHS[kind]}",
                param="model",
            )
        fmt = getattr(parsed, "response_format", None)
        if fmt is not None and fmt.type == "json_object" and not caps.json_mode:
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, "json mode is not supported", param="response_format")
        limit = getattr(parsed, "token_limit", lambda: None)()
        cap = self.settings.max_tokens_cap
        if limit is not None and cap is not None and limit > cap:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"max_tokens {limit} exceeds this server's cap of {cap}",
                param="max_tokens",
            )

    def _engine_body(self, parsed: InferenceRequest, deployment: Deployment) -> dict[str, Any]:
        body = parsed.engine_body()
        body["model"] = deployment.plan.remote_model or deployment.plan.model
        if parsed.stream:
            body["stream_options"] = {"include_usage": True}
        cap = self.settings.max_tokens_cap
        if cap is not None and "max_tokens" not in body and "input" not in body:
            body["max_tokens"] = cap
        return body

    # -- non-streaming ----------------------------------------------------------------------------------
    async def _unary(
        self,
        kind: RequestKind,
        body: dict[str, Any],
        deployment: Deployment,
        request: Request,
        ctx: RequestContext,
    ) -> Response:
        model = deployment.name
        status = 500
        tokens: tuple[int, int] | None = None
        admitted_at: float | None = None
        try:
            await self._admit(deployment)
            admitted_at = time.monotonic()
            url = deployment.worker.base_url() + PATHS[kind]
            upstream = asyncio.ensure_future(self._post(url, body, deployment))
            gone = asyncio.ensure_future(_wait_disconnect(request))
            try:
                done, _ = await asyncio.wait({upstream, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if upstream not in done:
                upstream.cancel()  # closing the connection makes the worker abort the generation
                with contextlib.suppress(BaseException):
                    await upstream
                status = 499
                return Response(status_code=499)
            data = upstream.result()
            payload = self._normalize(kind, data)
            usage = payload.get("usage") or {}
            tokens = (int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
            status = 200
            return JSONResponse(payload)
        except GatewayError as exc:
            status = exc.status
            raise
        finally:
            if admitted_at is not None:
                deployment.admission.release(time.monotonic() - admitted_at)
                self.metrics.running.labels(model).set(deployment.admission.running)
            self._finish(ctx, deployment, kind, status, tokens, None)

    async def _post(self, url: str, body: dict[str, Any], deployment: Deployment) -> dict[str, Any]:
        try:
            response = await self.client.post(url, json=body, timeout=self._upstream_timeout)
        except httpx.HTTPError as exc:
            raise transport_error(exc, deployment.name) from None
        if response.status_code != 200:
            err = deployment.adapter.normalize_error(response.status_code, response.content)
            raise upstream_error_to_gateway(err)
        try:
            data = response.json()
        except ValueError:
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "worker sent a body that is not JSON") from None
        if not isinstance(data, dict):
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "worker sent an unexpected body")
        return data

    @staticmethod
    def _normalize(kind: RequestKind, data: dict[str, Any]) -> dict[str, Any]:
        """One response shape whichever engine answered (required fields filled, extras dropped)."""
        try:
            if kind is RequestKind.CHAT:
                return ChatCompletion.model_validate(data).model_dump(mode="json")
            if kind is RequestKind.COMPLETION:
                return Completion.model_validate(data).model_dump(mode="json")
        except ValueError as exc:
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, f"worker response does not match the API: {exc}") from None
        return data

    # -- streaming --------------------------------------------------------------------------------------
    async def _stream(
        self,
        kind: RequestKind,
        parsed: InferenceRequest,
        body: dict[str, Any],
        deployment: Deployment,
        ctx: RequestContext,
    ) -> Response:
        model = deployment.name
        options = getattr(parsed, "stream_options", None)
        include_usage = options is not None and options.include_usage
        stats = StreamStats()
        state = _StreamState()
        url_path = PATHS[kind]

        async def open_upstream() -> httpx.Response:
            url = deployment.worker.base_url() + url_path
            try:
                req = self.client.build_request("POST", url, json=body, timeout=self._upstream_timeout)
                response = await self.client.send(req, stream=True)
            except httpx.HTTPError as exc:
                raise transport_error(exc, model) from None
            if response.status_code != 200:
                content = await response.aread()
                await response.aclose()
                raise upstream_error_to_gateway(deployment.adapter.normalize_error(response.status_code, content))
            state.upstream = response
            return response

        def relay(upstream: httpx.Response) -> AsyncGenerator[bytes, None]:
            return relay_stream(
                sse_frames(upstream), stats, model=model, include_usage=include_usage,
                keepalive_s=self.settings.keepalive_interval_s,
            )  # fmt: skip

        async def on_close() -> None:
            if state.closed:
                return
            state.closed = True
            if state.upstream is not None:
                await state.upstream.aclose()
            if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
                deployment.admission.release(time.monotonic() - (state.admitted_at or time.monotonic()))
            elif not acquire.done():
                acquire.cancel()
                with contextlib.suppress(BaseException):
                    await acquire
            self.metrics.running.labels(model).set(deployment.admission.running)
            status = state.status
            if stats.error is not None and status == 200:
                status = stats.error.status
            if status == 200 and not stats.completed and stats.error is None:
                status = 499  # the client went away
            tokens = None
            if stats.completion_tokens is not None:
                tokens = (stats.prompt_tokens or 0, stats.completion_tokens)
            self._finish(ctx, deployment, kind, status, tokens, stats)

        admission = deployment.admission
        if admission.running < admission.capacity and not admission.waiting:
            # A free slot is granted without waiting: no task, no timer, no extra loop turn before the send.
            acquire: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            try:
                await self._admit(deployment)
            except GatewayError as exc:
                acquire.set_exception(exc)
            else:
                acquire.set_result(None)
            done = {acquire}
        else:
            acquire = asyncio.ensure_future(self._admit(deployment))
            done, _ = await asyncio.wait({acquire}, timeout=self.settings.keepalive_interval_s)
        if done:
            try:
                acquire.result()
                state.admitted_at = time.monotonic()
                upstream = await open_upstream()
            except GatewayError as exc:
                state.status = exc.status
                await on_close()
                raise
            return RelayResponse(_settle_before_done(relay(upstream), on_close), on_close, headers=SSE_HEADERS)

        async def queued_then_relay() -> AsyncGenerator[bytes, None]:
            # Headers are out: keep the client's connection alive while queued, errors become SSE frames.
            while not acquire.done():
                yield b": waiting for a free slot\n\n"
                await asyncio.wait({acquire}, timeout=self.settings.keepalive_interval_s)
            try:
                acquire.result()
                state.admitted_at = time.monotonic()
                upstream = await open_upstream()
            except GatewayError as exc:
                stats.error = exc
                state.status = exc.status
                yield sse_error_frame(exc)
                yield DONE_FRAME
                return
            async for frame in relay(upstream):
                yield frame

        return RelayResponse(_settle_before_done(queued_then_relay(), on_close), on_close, headers=SSE_HEADERS)

    # -- shared -----------------------------------------------------------------------------------------
    async def _admit(self, deployment: Deployment) -> None:
        model = deployment.name
        self.metrics.queue_depth.labels(model).set(deployment.admission.waiting + 1)
        try:
            waited = await deployment.admission.acquire()
        except GatewayError as exc:
            self.metrics.rejections.labels(model, exc.code.value).inc()
            raise
        finally:
            self.metrics.queue_depth.labels(model).set(deployment.admission.waiting)
        self.metrics.queue_time.labels(model).observe(waited)
        self.metrics.running.labels(model).set(deployment.admission.running)

    def _finish(
        self,
        ctx: RequestContext,
        deployment: Deployment,
        kind: RequestKind,
        status: int,
        tokens: tuple[int, int] | None,
        stats: StreamStats | None,
    ) -> None:
        model = deployment.name
        total = (tokens[0] + tokens[1]) if tokens else 0
        ctx.principal.done(total)
        if tokens:
            self.metrics.prompt_tokens.labels(model).inc(tokens[0])
            self.metrics.generation_tokens.labels(model).inc(tokens[1])
        self.metrics.latency.labels(model).observe(time.monotonic() - ctx.started)
        if stats is not None and stats.first_token_at is not None:
            self.metrics.ttft.labels(model).observe(stats.first_token_at - ctx.started)
            itl = self.metrics.itl.labels(model)
            for gap in stats.inter_chunk_s:
                itl.observe(gap)
        self._account(ctx, model, kind, status, tokens)

    def _account(
        self, ctx: RequestContext, model: str, kind: RequestKind, status: int, tokens: tuple[int, int] | None
    ) -> None:
        self.metrics.requests.labels(model, kind.value, str(status)).inc()
        access_log.info(
            json.dumps(
                {
                    "request_id": ctx.request_id,
                    "model": model,
                    "endpoint": kind.value,
                    "key_id": ctx.principal.key_id,
                    "status": status,
                    "prompt_tokens": tokens[0] if tokens else None,
                    "completion_tokens": tokens[1] if tokens else None,
                    "latency_ms": round((time.monotonic() - ctx.started) * 1000, 1),
                    **({"prompt": ctx.prompt} if ctx.prompt is not None else {}),
                }
            )
        )


async def _settle_before_done(
    frames: AsyncGenerator[bytes, None], settle: Callable[[], Awaitable[None]]
) -> AsyncGenerator[bytes, None]:
    """Release the slot and the key's in-flight count, and account the request, before the client sees
    `[DONE]`: a client that sends its next request the moment a stream ends must never be queued or
    refused (per-key max_concurrent) because of the stream it has just finished."""
    try:
        async for frame in frames:
            if frame == DONE_FRAME:
                await settle()
            yield frame
    finally:
        await frames.aclose()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
