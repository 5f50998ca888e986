"""POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/rerank: parse → service → render."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from backends.base import RequestKind
from gateway.errors import Envelope, GatewayError
from gateway.ops.auth import ANONYMOUS
from gateway.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, parse_request
from gateway.protocol.rerank import RerankRequest, parse_rerank_request
from gateway.routes.boundary import speaking
from gateway.routes.context import AppContext, app_context
from gateway.routes.direct import DirectRoute
from gateway.serving.prompt_prefix import SessionHints, session_key
from gateway.serving.relay import SSE_HEADERS, RelayResponse
from gateway.serving.service import RequestContext, StreamSession, UnaryResult
from gateway.serving.session import CONTEXT_KEY

# handlers take the Request alone: no dependency solving; errors in OpenAI's envelope
router = APIRouter(route_class=speaking(Envelope.OPENAI, DirectRoute))


def body_schema(model: type[Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}
            },
        }
    }


def model_hint(raw: bytes) -> str | None:
    """The `model` a refused body named, for its access-log line and metric (never trusted otherwise)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def render(result: UnaryResult | StreamSession) -> Response:
    """The HTTP response for a service result (shared by every API that rides on the chat path)."""
    if isinstance(result, StreamSession):
        return RelayResponse(result.frames(), result.close, line=result.line, headers=SSE_HEADERS)
    if result.body is None:
        return Response(status_code=result.status)
    return JSONResponse(result.body, status_code=result.status)


async def begin(
    request: Request, kind: RequestKind, *, api: str | None = None
) -> tuple[AppContext, RequestContext, bytes]:
    """Authenticate (a bearer key or Anthropic's `x-api-key`), then read the body; a refusal here is accounted
    like every other. `api` names a translated API riding on `kind` (the endpoint label)."""
    app: AppContext = app_context(request)
    ctx = RequestContext(request_id=request.state.request_id, principal=ANONYMOUS, started=time.monotonic(),
                         kind=kind, api=api)  # fmt: skip
    request.scope.setdefault("state", {})[CONTEXT_KEY] = ctx  # accounted once, even by the error boundary
    raw = b""
    try:  # the key from the headers first: a caller without one never gets its body read
        ctx.principal = app.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
        app.check_accepting()
        raw = await request.body()  # bounded in size and time: `gateway.serving.middleware.RequestBodyMiddleware`
    except GatewayError as exc:
        app.service.refused(ctx, exc, model_hint(raw))
        raise
    return app, ctx, raw


async def _handle(request: Request, kind: RequestKind, model_type: type[Any]) -> Response:
    app, ctx, raw = await begin(request, kind)
    try:
        parsed = parse_request(raw, model_type)
    except GatewayError as exc:
        app.service.refused(ctx, exc, model_hint(raw))
        raise
    if isinstance(parsed, ChatCompletionRequest | CompletionRequest):
        hints = SessionHints(prompt_cache_key=parsed.prompt_cache_key, user=parsed.user)
        ctx.session_key = session_key(hints, request.headers)
    return render(await app.service.handle(parsed, request, ctx))


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    return await _handle(request, RequestKind.CHAT, ChatCompletionRequest)


@router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
async def completions(request: Request) -> Response:
    return await _handle(request, RequestKind.COMPLETION, CompletionRequest)


@router.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    return await _handle(request, RequestKind.EMBEDDING, EmbeddingRequest)


@router.post("/v1/rerank", openapi_extra=body_schema(RerankRequest))
@router.post("/v1/reranking", openapi_extra=body_schema(RerankRequest))  # llama.cpp's server's other name
async def rerank(request: Request) -> Response:
    app, ctx, raw = await begin(request, RequestKind.RERANK)
    try:
        parsed = parse_rerank_request(raw)
    except GatewayError as exc:
        app.service.refused(ctx, exc, model_hint(raw))
        raise
    return render(await app.service.handle(parsed, request, ctx))
