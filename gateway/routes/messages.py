"""Anthropic's Messages API over the one chat path: POST /v1/messages and POST /v1/messages/count_tokens.

    parse (MessagesRequest) → to_chat (the typed chat request) → Service.handle (auth, admission, metrics,
    disconnect-abort, logging: as for chat) → to_message | MessagesStream over the chat chunks

The key is taken from `x-api-key` (Anthropic's SDKs) or `Authorization: Bearer` (Anthropic's SDKs with an
auth token); `anthropic-version` and `anthropic-beta` are accepted and ignored. The router declares
Anthropic's error envelope (`speaking`), so every error, including those of authentication, admission and
the body's size, is rendered in it by the gateway's error boundary with the same status and Retry-After.
count_tokens is exact: the chat request is run with `max_tokens: 1` and its prompt's token count read from
the usage (one prefill and one decoded token on the worker, admitted like any request).

These routes are left out of /openapi.json: that document describes the OpenAI-shaped surface (its
error envelope in particular), and Anthropic publishes its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from backends.base import RequestKind
from gateway.errors import Envelope, ErrorCode, GatewayError
from gateway.protocol.anthropic import CountTokensRequest, MessagesRequest
from gateway.protocol.responses import ChatCompletion
from gateway.routes.boundary import speaking
from gateway.routes.direct import DirectRoute
from gateway.routes.inference import begin, model_hint, render
from gateway.serving.prompt_prefix import SessionHints, session_key
from gateway.serving.relay import SSE_HEADERS, RelayResponse
from gateway.serving.service import StreamSession, UnaryResult
from gateway.translate import MessagesStream, messages, new_id, parse_body
from gateway.translate.chunk_loop import translated_events
from gateway.translate.params import MESSAGES, renamed

router = APIRouter(route_class=speaking(Envelope.ANTHROPIC, DirectRoute))
NAMESPACES = {"/v1/messages": Envelope.ANTHROPIC}
"""Anthropic's API owns the paths below its Messages route, also those no route of ours serves (the Message
Batches API): their 404 and 405 are in its envelope (`gateway.routes.boundary.ErrorBoundary`)."""

R = TypeVar("R", MessagesRequest, CountTokensRequest)


async def _submit(
    request: Request,
    api: str,
    parse: Callable[[bytes], R],
    render: Callable[[R, ChatCompletion], dict[str, Any]],
) -> tuple[R, UnaryResult | StreamSession]:
    """begin → parse → translate (the typed chat request) → the service, which passes the typed non-streamed
    answer through `render` before accounting it; a refusal before the service is accounted here, the service
    accounts its own."""
    app, ctx, raw = await begin(request, RequestKind.CHAT, api=api)
    try:
        req = parse(raw)
        chat = messages.to_chat(req)
    except GatewayError as exc:
        app.service.refused(ctx, exc, model_hint(raw))
        raise
    user_id = req.metadata.user_id if isinstance(req, MessagesRequest) and req.metadata else None
    ctx.session_key = session_key(SessionHints(anthropic_user_id=user_id), request.headers)
    try:
        return req, await app.service.handle(chat, request, ctx, translate=lambda body: render(req, body))
    except GatewayError as exc:  # accounted by the service; it names chat parameters
        image = messages.client_image_param(exc.param, chat, req)
        if image is not None:  # an image's error names the client's block, not just `messages`
            raise GatewayError(exc.code, exc.message, param=image, status=exc.status) from None
        raise renamed(exc, MESSAGES) from None


def _parse_message(raw: bytes) -> MessagesRequest:
    return parse_body(raw, MessagesRequest, dotted=True)


def _parse_count(raw: bytes) -> CountTokensRequest:
    return parse_body(raw, CountTokensRequest, dotted=True)


def _render_message(req: MessagesRequest, chat: ChatCompletion) -> dict[str, Any]:
    return messages.to_message(chat, req, message_id=new_id("msg"))


def _render_count(_req: CountTokensRequest, chat: ChatCompletion) -> dict[str, Any]:
    return {"input_tokens": messages.prompt_tokens(chat.usage)}


@router.post("/v1/messages", include_in_schema=False)
async def create_message(request: Request) -> Response:
    req, result = await _submit(request, "messages", _parse_message, _render_message)
    if isinstance(result, StreamSession):
        events = translated_events(result, MessagesStream(req, message_id=new_id("msg")))
        return RelayResponse(events, result.close, headers=SSE_HEADERS)
    if result.body is None:  # the client went away
        return render(result)
    return JSONResponse(result.body)


@router.post("/v1/messages/count_tokens", include_in_schema=False)
async def count_tokens(request: Request) -> Response:
    _, result = await _submit(request, "count_tokens", _parse_count, _render_count)
    if isinstance(result, StreamSession):  # never: the body asks for no stream
        await result.close()
        raise GatewayError(ErrorCode.INTERNAL_ERROR, "count_tokens was streamed")
    if result.body is None:
        return render(result)
    return JSONResponse(result.body)
