"""The request flow for inference endpoints: resolve → authorise → check → build → admit → call → account.

route ─▶ Service.handle(parsed, request, ctx) ─▶ UnaryResult | StreamSession (the route renders it)
           ├─ registry.resolve(model)             404 model_not_found
           ├─ principal.check_model / admit       403 / 429
           ├─ replicas.pick(deployment)           a model with replicas: the one for this request
           ├─ parsed.check(capabilities)          400 names the parameter
           ├─ parsed.to_engine(target)            the typed engine request of its kind (backends.request)
           ├─ residency.check(deployment)         503 + Retry-After: a pinned worker restarting, a failed load
           ├─ RequestScope.schedule               load (503 past load_wait_s), then admit (429), then call:
           ├─ Upstream.post | open_stream         UnaryCall | StreamSession; worker errors mapped there
           └─ Unanswered (a replica's worker      once more to another replica of the model (`_retry`), before
              answered nothing)                   any byte reached the client; else the error as before

The service never asks which kind of request it has: every request type implements `ServedRequest`. A
request refused anywhere on the way (including by the routes, before the service) is accounted once
through `Service.refused`.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial

import httpx
from starlette.requests import Request

from backends.request import AnyEngineRequest, EngineImage, EngineRequest, RequestKind
from gateway.config import PromptCacheSettings, ServerSettings
from gateway.errors import GatewayError
from gateway.lifecycle.deployments import Deployment, Registry, Task
from gateway.lifecycle.memory import HOST, NoProbe, Pools
from gateway.lifecycle.residency import Residency
from gateway.ops.metrics import Metrics
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.responses import ChatCompletion
from gateway.protocol.served import ServedRequest
from gateway.serving.prompt_prefix import ResponseChains, neutralise
from gateway.serving.replicas import Replicas
from gateway.serving.session import RequestContext, RequestScope, StreamSession, account
from gateway.serving.silence import read_timeout_s
from gateway.serving.unary import Translate, UnaryCall, UnaryResult
from gateway.serving.upstream import Unanswered, Upstream
from gateway.serving.vision_parts import ImageIntake

__all__ = ["RequestContext", "Service", "StreamSession", "Translate", "UnaryResult"]

log = logging.getLogger("voltgate.serving")

UNKNOWN_MODEL = "unknown"  # metrics label for requests naming no configured model (bounded cardinality)
UNCAPPED_APIS = frozenset({"responses"})  # translated APIs that a model's default_max_tokens does not apply to
TASKS: dict[RequestKind, Task] = {RequestKind.CHAT: "generate", RequestKind.COMPLETION: "generate",
                                  RequestKind.EMBEDDING: "embed", RequestKind.RERANK: "rerank"}  # fmt: skip
"""The model task a request kind needs: an alias pattern reaches only a model of it (`Registry.resolve`)."""
CONTEXT_CLAMPED_APIS = frozenset({"messages"})
"""APIs whose clients send a required limit sized for another model (Claude Code: `max_tokens` 64000): a limit
over the context is served up to the context there, not refused (elsewhere it is a 400, as OpenAI answers)."""
PROGRESS_HEADER = "x-voltgate-progress"  # `data`: loading-progress chunks for this stream (server.load_progress)


class Service:
    def __init__(
        self,
        registry: Registry,
        client: httpx.AsyncClient,
        settings: ServerSettings,
        metrics: Metrics,
        residency: Residency | None = None,
        images: ImageIntake | None = None,
        prompt_cache: PromptCacheSettings | None = None,
    ):
        self.registry = registry
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.images = images or ImageIntake()
        self.prompt_cache = prompt_cache or PromptCacheSettings()
        self.chains = ResponseChains()  # Responses' session keys, for `previous_response_id` turns
        self.replicas = Replicas(registry, metrics)
        self.residency = residency or Residency(registry, settings, metrics, Pools({HOST: None}, NoProbe()))
        self._upstream_timeout = httpx.Timeout(connect=5.0, read=settings.upstream_timeout_s, write=30.0, pool=30.0)
        self._upstreams: dict[str, Upstream] = {}

    # -- entry point ------------------------------------------------------------------------------------
    async def handle(
        self, parsed: ServedRequest, request: Request, ctx: RequestContext, translate: Translate | None = None
    ) -> UnaryResult | StreamSession:
        """Serve one request. A non-streamed answer is passed through `translate` (an API translation layer's
        rendering, e.g. chat completion → Anthropic Message) before it is accounted, so a rendering that fails
        is logged and counted with its error's status, never as the 200 the chat path gave."""
        try:
            model = deployment = self.registry.resolve(parsed.model, TASKS[parsed.kind])
        except GatewayError as exc:
            self.refused(ctx, exc, parsed.model)
            raise
        if self.settings.log_prompts:
            ctx.prompt = parsed.log_prompt()
        try:
            ctx.principal.check_model(deployment.name, deployment.aliases)
            deployment = self.replicas.pick(deployment, parsed, ctx.session_key)
            parsed.check(deployment.capabilities, f"model {deployment.name!r} ({deployment.plan.engine.value})")
            images = await self.images.engine_images(
                parsed, model=deployment.name, vision=deployment.capabilities.vision
            )
            engine = self._engine(deployment, parsed, ctx, images)
            ctx.principal.admit()
        except GatewayError as exc:
            self.refused(ctx, exc, deployment.name)
            raise
        retryable = self.registry.has_replicas(model)  # one dict lookup: a model with one replica pays nothing more
        scope = RequestScope(deployment, ctx, self.metrics, self.residency, units=parsed.units)
        try:
            return await self._attempt(scope, parsed, engine, request, translate, retryable=retryable)
        except Unanswered as exc:
            if not retryable:
                raise
            return await self._retry(model, scope, exc, parsed, request, translate, images)

    def _engine(
        self,
        deployment: Deployment,
        parsed: ServedRequest,
        ctx: RequestContext,
        images: tuple[EngineImage, ...],
        *,
        count: bool = True,
    ) -> AnyEngineRequest:
        """The engine request for `deployment`, once its residency says it can serve (fail fast: a pinned worker
        restarting, a load that just failed). `count`: its neutralised bytes counted (not again for a retry)."""
        engine = parsed.to_engine(self._target(deployment, ctx.api, images))
        engine = self._keep_prefix(engine, ctx, deployment.name, count=count)
        self.residency.check(deployment)
        return engine

    async def _attempt(
        self,
        scope: RequestScope,
        parsed: ServedRequest,
        engine: AnyEngineRequest,
        request: Request,
        translate: Translate | None,
        *,
        retryable: bool,
    ) -> UnaryResult | StreamSession:
        """Send the request to `scope`'s replica: the unary answer, or the stream opened (or waiting). When
        `retryable`, an `Unanswered` comes back with the scope still open (`_retry` ends it)."""
        deployment = scope.deployment
        if translate is None and deployment.reasoning.field != "reasoning_content":  # a chat answer, renamed
            translate = partial(ChatCompletion.wire, reasoning_field=deployment.reasoning.field)
        upstream, wait_s = self.upstream(deployment), self.settings.load_wait_s
        if not parsed.stream:
            call = UnaryCall(scope, upstream=upstream, request=engine, load_wait_s=wait_s, retryable=retryable)
            return await call.run(lambda: _wait_disconnect(request), translate)
        progress = request.headers.get(PROGRESS_HEADER, self.settings.load_progress).strip().lower()
        session = StreamSession(
            scope, upstream=upstream, request=engine, include_usage=parsed.include_usage,
            keepalive_s=self.settings.keepalive_interval_s, load_wait_s=wait_s, progress_data=progress == "data",
            keepalive_chunks=self.settings.chat_keepalive == "chunk", retryable=retryable,
        )  # fmt: skip
        await session.open()
        return session

    async def _retry(
        self,
        model: Deployment,
        failed: RequestScope,
        exc: Unanswered,
        parsed: ServedRequest,
        request: Request,
        translate: Translate | None,
        images: tuple[EngineImage, ...],
    ) -> UnaryResult | StreamSession:
        """Send a request its replica answered nothing to once more, to another replica of the model (the
        router's choice among those taking requests); without one, `failed` is accounted with `exc` as it always
        was. Once only: a second replica failing too points past one worker (a host, the network), and each try
        costs up to the connect timeout, so the client hears of it rather than waits through every replica."""
        ctx = failed.ctx
        other = self.replicas.retry(model, failed.deployment, parsed, ctx.session_key)
        engine: AnyEngineRequest | None = None
        if other is not None:
            with contextlib.suppress(GatewayError):  # the other cannot take it after all: the first error stands
                parsed.check(other.capabilities, f"model {other.name!r} ({other.plan.engine.value})")
                engine = self._engine(other, parsed, ctx, images, count=False)  # counted for the first
        if other is None or engine is None:
            failed.finish(exc.status, error=exc)
            raise exc
        failed.abandon()
        self.metrics.replica_retries.labels(model.name, failed.model, exc.reason).inc()
        log.info("request %s: replica %s answered nothing (%s: %s); sent to %s",
                 ctx.request_id, failed.model, exc.reason, exc.message, other.name)  # fmt: skip
        scope = RequestScope(other, ctx, self.metrics, self.residency, units=parsed.units)
        return await self._attempt(scope, parsed, engine, request, translate, retryable=False)

    def _keep_prefix(
        self, engine: AnyEngineRequest, ctx: RequestContext, model: str, *, count: bool = True
    ) -> AnyEngineRequest:
        """The engine request with its volatile client bytes neutralised (each rule counted) and the session
        key attached (`gateway.serving.prompt_prefix`; `prompt_cache` in the config switches each off)."""
        if not isinstance(engine, EngineRequest):
            return engine
        engine, rules = neutralise(engine, self.prompt_cache)
        for rule in rules if count else ():
            self.metrics.prompt_neutralised.labels(model, rule.value).inc()
        if ctx.session_key is not None and self.prompt_cache.session_key:
            engine = engine.model_copy(update={"session_key": ctx.session_key})
        return engine

    def upstream(self, deployment: Deployment) -> Upstream:
        """The deployment's one `Upstream` (a new one when a reload replaced the deployment of that name)."""
        upstream = self._upstreams.get(deployment.name)
        if upstream is None or upstream.deployment is not deployment:
            upstream = self._upstreams[deployment.name] = Upstream(
                deployment, self.client, self._upstream_timeout, read_s=partial(self._silence_s, deployment)
            )
        return upstream

    def _silence_s(self, deployment: Deployment, request: AnyEngineRequest, body_bytes: int) -> float:
        """The read timeout of a call to `deployment`'s worker, from the plan's prediction as it is now. A remote
        endpoint's speed is not ours to predict: it keeps `upstream_timeout_s`."""
        remote = deployment.plan.remote_url is not None
        prediction = None if remote else self.metrics.live.predictions.get(deployment.name)
        return read_timeout_s(deployment.capabilities, prediction, request, body_bytes,
                              floor_s=self.settings.stream_silence_floor_s,
                              ceiling_s=self.settings.upstream_timeout_s)  # fmt: skip

    def _target(self, deployment: Deployment, api: str | None, images: tuple[EngineImage, ...] = ()) -> EngineTarget:
        """The deployment's side of the translation. A model's `default_max_tokens` keeps chat frontends'
        background tasks short; an agent on the Responses API that sets no `max_output_tokens` gets what OpenAI
        gives: up to the context."""
        plan = deployment.plan
        return EngineTarget(
            model=plan.remote_model or plan.model,
            default_max_tokens=None if api in UNCAPPED_APIS else deployment.default_max_tokens,
            max_tokens_cap=self.settings.max_tokens_cap,
            clamp=self.settings.max_tokens_over_cap == "clamp",
            sampling=deployment.sampling,
            embed_truncate=plan.embed_truncate,
            images=images,
            reasoning=deployment.reasoning,
            context_tokens=None if plan.remote_url is not None or api in CONTEXT_CLAMPED_APIS else plan.context_tokens,
        )

    def refused(self, ctx: RequestContext, exc: GatewayError, model: str | None) -> None:
        """Account a request refused before it was admitted (one access-log line, counted by status)."""
        label = UNKNOWN_MODEL
        if model is not None:
            with contextlib.suppress(GatewayError):
                label = self.registry.resolve(model).name
        self.metrics.rejections.labels(label, exc.code.value).inc()
        account(self.metrics, ctx, label, exc.status, None, exc, named=model)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
