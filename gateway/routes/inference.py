"""POST /v1/chat/completions, /v1/completions, /v1/embeddings."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from backends.base import RequestKind
from gateway.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, parse_request
from gateway.routes.context import AppContext, app_context
from gateway.service import RequestContext

router = APIRouter()


def _body_schema(model: type[Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}
            },
        }
    }


async def _handle(request: Request, kind: RequestKind, model_type: type[Any]) -> Response:
    app: AppContext = app_context(request)
    started = time.monotonic()
    principal = app.keys.authenticate(request.headers.get("authorization"))
    app.check_accepting()
    parsed = parse_request(await request.body(), model_type)
    ctx = RequestContext(request_id=request.state.request_id, principal=principal, started=started)
    return await app.service.handle(kind, parsed, request, ctx)


@router.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    return await _handle(request, RequestKind.CHAT, ChatCompletionRequest)


@router.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
async def completions(request: Request) -> Response:
    return await _handle(request, RequestKind.COMPLETION, CompletionRequest)


@router.post("/v1/embeddings", openapi_extra=_body_schema(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    return await _handle(request, RequestKind.EMBEDDING, EmbeddingRequest)
