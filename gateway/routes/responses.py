"""OpenAI's Responses API over the one chat path: POST /v1/responses, GET and DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

    parse (ResponsesRequest) → previous_response_id's history from the store → to_chat (the typed chat request)
      → Service.handle (auth, admission, metrics, disconnect-abort, logging: as for chat)
      → to_response | ResponsesStream over the chat chunks → store (`store: true`, before the client sees
        the end, so a follow-up sent at once finds it)

Errors are OpenAI's envelope, rendered by the app's handler; they name the Responses parameters.
Stored responses belong to the API key that created them: another key gets 404 for them.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, Response

from backends.base import RequestKind
from gateway.errors import Envelope, ErrorCode, GatewayError
from gateway.ops.store import NotFound, ResponseStore
from gateway.protocol.responses import ChatCompletion
from gateway.protocol.responses_api import ReasoningConfig, ResponsesRequest
from gateway.routes.boundary import speaking
from gateway.routes.context import AppContext, app_context
from gateway.routes.direct import DirectRoute
from gateway.routes.inference import begin, body_schema, model_hint, render
from gateway.serving.prompt_prefix import SessionHints, session_key
from gateway.serving.relay import SSE_HEADERS, RelayResponse
from gateway.serving.service import StreamSession
from gateway.translate import ResponsesStream, new_id, parse_body, responses
from gateway.translate.chunk_loop import translated_events
from gateway.translate.params import RESPONSES, renamed

log = logging.getLogger("voltgate")
router = APIRouter(route_class=speaking(Envelope.OPENAI, DirectRoute))

API = "responses"  # the endpoint label of these requests in metrics and the access log
DROPPED_TOOLS_HEADER = "x-voltgate-dropped-tools"  # the hosted tools a turn was served without (comma-separated)


def _store(app: AppContext) -> ResponseStore:
    assert app.store is not None, "the lifespan opens the response store"
    return app.store


@dataclass(frozen=True)
class _Turn:
    """One POST /v1/responses after validation: what it asked, who asked, and the Response's identity."""

    req: ResponsesRequest
    store: ResponseStore
    owner: str
    response_id: str
    created_at: int

    async def save(self, response: dict[str, Any]) -> None:
        if self.req.stores:
            await self.store.put(response, responses.stored_input(self.req), self.owner)

    def render(self, chat: ChatCompletion) -> dict[str, Any]:
        """The Response for the typed non-streamed chat answer (the service accounts the request after this)."""
        return responses.to_response(
            chat, self.req, response_id=self.response_id, created_at=self.created_at, completed_at=int(time.time())
        )

    def events(self, session: StreamSession) -> AsyncIterator[bytes]:
        """The Responses event stream over the session's chat chunks; the session is closed by the caller.
        The response is stored as it ended, just before its last event goes out."""
        stream = ResponsesStream(self.req, response_id=self.response_id, created_at=self.created_at)

        async def store() -> None:
            try:
                await self.save(stream.final_response())
            except (sqlite3.Error, OSError):  # the answer is out already; a follow-up turn will get 400
                log.exception("could not store response %s", self.response_id)

        return translated_events(session, stream, before_end=store)


async def _history(store: ResponseStore, req: ResponsesRequest, owner: str) -> list[dict[str, Any]]:
    previous = req.previous_response_id
    if previous is None:
        return []
    try:
        return await store.history(previous, owner)
    except NotFound as exc:
        message = (
            f"Previous response with id {previous!r} not found."
            if exc.response_id == previous
            else f"Previous response {previous!r} continues {exc.response_id!r}, which is no longer stored."
        )
        raise GatewayError(ErrorCode.INVALID_REQUEST, message, param="previous_response_id") from None


@router.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest))
async def create_response(request: Request) -> Response:
    app, ctx, raw = await begin(request, RequestKind.CHAT, api=API)
    store = _store(app)
    try:
        req = _limited(parse_body(raw, ResponsesRequest), app.service.settings.max_tokens_cap)
        history = await _history(store, req, ctx.principal.key_id)
        chat = responses.to_chat(req, history)
    except GatewayError as exc:
        app.service.refused(ctx, exc, model_hint(raw))
        raise
    req = _with_effort(req, app)
    turn = _Turn(req, store, ctx.principal.key_id, new_id("resp"), int(time.time()))
    hints = SessionHints(prompt_cache_key=req.prompt_cache_key, previous_response_id=req.previous_response_id,
                         user=req.user)  # fmt: skip
    ctx.session_key = session_key(hints, request.headers, app.service.chains)
    if ctx.session_key is not None:  # the next turn of this chain keeps the key
        app.service.chains.remember(turn.response_id, ctx.session_key)
    headers = _dropped(req, ctx.request_id)
    try:
        result = await app.service.handle(chat, request, ctx, translate=turn.render)
    except GatewayError as exc:  # accounted by the service
        raise renamed(exc, RESPONSES) from None
    if isinstance(result, StreamSession):
        return RelayResponse(turn.events(result), result.close, headers={**SSE_HEADERS, **headers})
    if result.body is None:  # the client went away
        return render(result)
    await turn.save(result.body)
    return JSONResponse(result.body, headers=headers)


def _limited(req: ResponsesRequest, cap: int | None) -> ResponsesRequest:
    """The request with the output limit it will be served with: a request that sets none is bounded only by
    the context (as OpenAI serves it) or, when set, by `server.max_tokens_cap`, which the Response echoes."""
    if req.max_output_tokens is None and cap is not None:
        return req.model_copy(update={"max_output_tokens": cap})
    return req


def _with_effort(req: ResponsesRequest, app: AppContext) -> ResponsesRequest:
    """The request with the reasoning effort it is served with, which the Response echoes: its own, else the
    model's default (config `reasoning.effort`); None when neither names one (the chat template decides)."""
    if req.reasoning is not None and req.reasoning.effort is not None:
        return req
    try:
        effort = app.service.registry.resolve(req.model).reasoning.effort
    except GatewayError:  # an unknown model: the service refuses it next
        return req
    if effort is None:
        return req
    reasoning = req.reasoning or ReasoningConfig()
    return req.model_copy(update={"reasoning": reasoning.model_copy(update={"effort": effort})})


def _dropped(req: ResponsesRequest, request_id: str) -> dict[str, str]:
    """The header naming the offered hosted tools this turn is served without, logged once."""
    dropped = req.dropped_tools()
    if not dropped:
        return {}
    log.warning("request %s: served without the hosted tools %s (no engine here has them)", request_id,
                ", ".join(dropped))  # fmt: skip
    return {DROPPED_TOOLS_HEADER: ", ".join(dropped)}


def _reader(request: Request) -> tuple[ResponseStore, str]:
    """The store and the caller's key id, for reading or deleting stored responses."""
    app = app_context(request)
    principal = app.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    return _store(app), principal.key_id


def _not_found(response_id: str) -> GatewayError:
    return GatewayError(ErrorCode.NOT_FOUND, f"Response with id {response_id!r} not found.", param="response_id")


@router.get("/v1/responses/{response_id}")
async def retrieve_response(request: Request, response_id: str, stream: bool = False) -> Response:
    store, owner = _reader(request)
    if stream:
        raise GatewayError(
            ErrorCode.UNSUPPORTED_PARAMETER, "replaying a stored response as a stream is not supported", param="stream"
        )
    try:
        return JSONResponse(await store.get(response_id, owner))
    except NotFound:
        raise _not_found(response_id) from None


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    store, owner = _reader(request)
    try:
        await store.delete(response_id, owner)
    except NotFound:
        raise _not_found(response_id) from None
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    request: Request,
    response_id: str,
    limit: int = Query(default=20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    """Every item the model saw for this response, as OpenAI lists them: the earlier turns of its
    previous_response_id chain (inputs and outputs, as far as still stored), then its own input."""
    store, owner = _reader(request)
    try:
        stored = await store.input_items(response_id, owner, with_history=True)
    except NotFound:
        raise _not_found(response_id) from None
    items = [responses.input_item_resource(item) for item in stored]
    if order == "desc":
        items.reverse()
    start = 0
    if after is not None:
        found = next((i for i, item in enumerate(items) if item.get("id") == after), None)
        if found is None:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"no input item with id {after!r}", param="after")
        start = found + 1
    page = items[start : start + limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": start + limit < len(items),
        }
    )
