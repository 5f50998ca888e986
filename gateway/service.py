"""The request flow for inference endpoints: resolve → authorise → check → build → admit → relay → account.

route ─▶ Service.handle(parsed, request, ctx) ─▶ UnaryResult | StreamSession (the route renders it)
           ├─ registry.resolve(model)             404 model_not_found
           ├─ principal.check_model / admit       403 / 429
           ├─ capability check                    400 names the parameter
           ├─ build_engine_request                the one typed request every worker validates
           ├─ residency.check(deployment)         503 + Retry-After: a pinned worker restarting, a failed load
           ├─ RequestScope load                   waits for an on-demand model's load (503 past load_wait_s)
           ├─ RequestScope admit                  429 + Retry-After when the queue is full
           └─ relay (stream | JSON)               worker errors normalised by the engine's adapter

A request refused anywhere on the way (including by the routes, before the service) is accounted once
through `Service.refused`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.requests import Request

from backends.base import RequestKind
from backends.request import EngineImage, EngineRequest
from gateway.config import ServerSettings
from gateway.deployments import Deployment, Registry
from gateway.embedding_requests import build_embedding_request
from gateway.engine_requests import build_engine_request, token_limit
from gateway.errors import ErrorCode, GatewayError
from gateway.memory import HOST, NoProbe, Pools
from gateway.metrics import Metrics
from gateway.protocol import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, InferenceRequest
from gateway.protocol.requests import EmbeddingRequest
from gateway.protocol.rerank import RerankRequest, RerankResponse
from gateway.relay import transport_error, upstream_error_to_gateway
from gateway.residency import Residency
from gateway.session import CLIENT_GONE, PATHS, RequestContext, RequestScope, StreamSession, account
from gateway.vision_parts import ImageIntake

__all__ = ["RequestContext", "Service", "StreamSession", "UnaryResult"]

UNKNOWN_MODEL = "unknown"  # metrics label for requests naming no configured model (bounded cardinality)
ServedRequest = InferenceRequest | RerankRequest
UNCAPPED_APIS = frozenset({"responses"})  # translated APIs that a model's default_max_tokens does not apply to
PROGRESS_HEADER = "x-voltgate-progress"  # `data`: loading-progress chunks for this stream (server.load_progress)


@dataclass(frozen=True)
class UnaryResult:
    """A non-streamed answer: the normalised body, or `body=None` with 499 when the client went away."""

    body: dict[str, Any] | None
    status: int = 200


Translate = Callable[[dict[str, Any]], dict[str, Any]]
"""An API translation layer's rendering of a non-streamed chat answer; raises `GatewayError` when it cannot."""


class Service:
    def __init__(
        self,
        registry: Registry,
        client: httpx.AsyncClient,
        settings: ServerSettings,
        metrics: Metrics,
        residency: Residency | None = None,
        images: ImageIntake | None = None,
    ):
        self.registry = registry
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.images = images or ImageIntake()
        self.residency = residency or Residency(registry, settings, metrics, Pools({HOST: None}, NoProbe()))
        self._upstream_timeout = httpx.Timeout(connect=5.0, read=settings.upstream_timeout_s, write=30.0, pool=30.0)

    # -- entry point ------------------------------------------------------------------------------------
    async def handle(
        self, parsed: ServedRequest, request: Request, ctx: RequestContext, translate: Translate | None = None
    ) -> UnaryResult | StreamSession:
        """Serve one request. A non-streamed answer is passed through `translate` (an API translation layer's
        rendering, e.g. chat completion → Anthropic Message) before it is accounted, so a rendering that fails
        is logged and counted with its error's status, never as the 200 the chat path gave."""
        try:
            deployment = self.registry.resolve(parsed.model)
        except GatewayError as exc:
            self.refused(ctx, exc, parsed.model)
            raise
        if self.settings.log_prompts:
            ctx.prompt = _prompt_for_log(parsed)
        try:
            ctx.principal.check_model(deployment.name, deployment.aliases)
            self._check_capabilities(ctx.kind, parsed, deployment)
            images = await self.images.engine_images(
                parsed, model=deployment.name, vision=deployment.capabilities.vision
            )
            body = self._engine_body(parsed, deployment, api=ctx.api, images=images)
            self.residency.check(deployment)  # fail fast: a pinned worker restarting, a load that just failed
            ctx.principal.admit()
        except GatewayError as exc:
            self.refused(ctx, exc, deployment.name)
            raise
        units = getattr(parsed, "n", None) or 1
        scope = RequestScope(deployment, ctx, self.metrics, self.residency, units=units)
        if parsed.stream:
            progress = request.headers.get(PROGRESS_HEADER, self.settings.load_progress).strip().lower()
            session = StreamSession(
                scope, client=self.client, body=body, include_usage=parsed.include_usage,
                timeout=self._upstream_timeout, keepalive_s=self.settings.keepalive_interval_s,
                load_wait_s=self.settings.load_wait_s, progress_data=progress == "data",
            )  # fmt: skip
            await session.open()
            return session
        return await self._unary(scope, body, request, translate)

    def refused(self, ctx: RequestContext, exc: GatewayError, model: str | None) -> None:
        """Account a request refused before it was admitted (one access-log line, counted by status)."""
        label = UNKNOWN_MODEL
        if model is not None:
            with contextlib.suppress(GatewayError):
                label = self.registry.resolve(model).name
        self.metrics.rejections.labels(label, exc.code.value).inc()
        account(self.metrics, ctx, label, exc.status, None, exc, named=model)

    # -- checks -----------------------------------------------------------------------------------------
    def _check_capabilities(self, kind: RequestKind, parsed: ServedRequest, deployment: Deployment) -> None:
        caps = deployment.capabilities
        name = f"model {deployment.name!r} ({deployment.plan.engine.value})"
        if kind not in caps.kinds:
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, f"{name} does not serve {PATHS[kind]}", param="model")
        logprobs = getattr(parsed, "logprobs", None)
        reports = caps.completion_logprobs if isinstance(parsed, CompletionRequest) else caps.logprobs
        if logprobs is not None and logprobs is not False and not reports:
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, f"{name} does not report logprobs", param="logprobs")
        if isinstance(parsed, EmbeddingRequest) and parsed.dimensions is not None and not caps.dimensions:
            why = f"{name} cannot shorten its vectors: `dimensions` needs a matryoshka model (matryoshka: true)"
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, why, param="dimensions")
        if not isinstance(parsed, ChatCompletionRequest):
            return
        fmt = parsed.response_format
        if fmt is not None and fmt.type == "json_schema" and not caps.json_schema:
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, f"{name} cannot follow a JSON schema",
                               param="response_format")  # fmt: skip
        if fmt is not None and fmt.type == "json_object" and not caps.json_mode:
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, "json mode is not supported", param="response_format")
        if parsed.tools and parsed.tool_choice != "none" and not caps.tools:
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, f"{name} has no tool-call parser configured",
                               param="tools")  # fmt: skip

    def _engine_body(
        self,
        parsed: ServedRequest,
        deployment: Deployment,
        *,
        api: str | None = None,
        images: tuple[EngineImage, ...] = (),
    ) -> dict[str, Any]:
        if isinstance(parsed, EmbeddingRequest):
            model = deployment.plan.remote_model or deployment.plan.model
            return build_embedding_request(parsed, model=model, truncate=deployment.plan.embed_truncate).wire()
        if not isinstance(parsed, ChatCompletionRequest | CompletionRequest):
            body = parsed.engine_body()
            body["model"] = deployment.plan.remote_model or deployment.plan.model
            return body
        # A model's `default_max_tokens` keeps chat frontends' background tasks short; an agent on the
        # Responses API that sets no `max_output_tokens` gets what OpenAI gives: up to the context.
        limit = token_limit(
            parsed,
            default_max_tokens=None if api in UNCAPPED_APIS else deployment.default_max_tokens,
            cap=self.settings.max_tokens_cap,
            clamp=self.settings.max_tokens_over_cap == "clamp",
        )
        model = deployment.plan.remote_model or deployment.plan.model
        engine_request: EngineRequest = build_engine_request(
            parsed, model=model, max_tokens=limit, defaults=deployment.sampling, images=images
        )
        return deployment.adapter.translate_request(engine_request)

    # -- non-streaming ----------------------------------------------------------------------------------
    async def _unary(
        self, scope: RequestScope, body: dict[str, Any], request: Request, translate: Translate | None
    ) -> UnaryResult:
        status = 500
        tokens: tuple[int, int] | None = None
        error: GatewayError | None = None
        try:
            upstream = asyncio.ensure_future(self._load_admit_post(scope, body))
            gone = asyncio.ensure_future(_wait_disconnect(request))
            try:
                done, _ = await asyncio.wait({upstream, gone}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                upstream.cancel()  # this handler was cancelled: never leave the request running unowned
                raise
            finally:
                gone.cancel()
            if upstream not in done:
                upstream.cancel()  # closing the connection makes the worker abort the generation
                with contextlib.suppress(BaseException):
                    await upstream
                status = CLIENT_GONE
                return UnaryResult(None, CLIENT_GONE)
            payload = _normalize(scope.ctx.kind, upstream.result())
            usage = payload.get("usage") or {}
            tokens = (int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
            if translate is not None:
                payload = translate(payload)
            status = 200
            return UnaryResult(payload)
        except GatewayError as exc:
            status, error = exc.status, exc
            raise
        finally:
            scope.finish(status, tokens, error=error)

    async def _load_admit_post(self, scope: RequestScope, body: dict[str, Any]) -> dict[str, Any]:
        await scope.load(self.settings.load_wait_s)
        if not scope.try_admit():
            await scope.admit()
        return await self._post(scope.deployment, scope.ctx.kind, body)

    async def _post(self, deployment: Deployment, kind: RequestKind, body: dict[str, Any]) -> dict[str, Any]:
        url = deployment.worker.base_url() + PATHS[kind]
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


def _normalize(kind: RequestKind, data: dict[str, Any]) -> dict[str, Any]:
    """One response shape whichever engine answered (required fields filled, extras dropped)."""
    try:
        if kind is RequestKind.CHAT:
            return ChatCompletion.model_validate(data).wire()
        if kind is RequestKind.COMPLETION:
            return Completion.model_validate(data).model_dump(mode="json")
        if kind is RequestKind.RERANK:
            return RerankResponse.model_validate(data).render()
    except ValueError as exc:
        raise GatewayError(ErrorCode.UPSTREAM_ERROR, f"worker response does not match the API: {exc}") from None
    return data


def _prompt_for_log(parsed: ServedRequest) -> Any:
    if isinstance(parsed, ChatCompletionRequest):
        return [{"role": m.role, "content": m.text()} for m in parsed.messages]
    if isinstance(parsed, CompletionRequest):
        return parsed.prompt
    if isinstance(parsed, RerankRequest):
        return {"query": parsed.query, "documents": parsed.documents}
    return parsed.input


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
