"""A zero-latency OpenAI-compatible upstream: streams `max_tokens` chunks instantly, so only relays cost time.

It speaks the worker HTTP contract the gateway relies on (`GET /health`, `GET /v1/models`,
`POST /v1/chat/completions` and `/v1/completions`, streaming or not, `stream_options.include_usage`,
`data: [DONE]`), so a gateway can be pointed at it as at a real worker:

    python -m bench.zero_upstream --port 9100 --model-name zero
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

TOKEN = " tok"


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    if chat:
        text = " ".join(str(m.get("content") or "") for m in body.get("messages") or () if isinstance(m, dict))
    else:
        prompt = body.get("prompt") or ""
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return len(text.split())


def create_app(model_name: str = "zero", slots: int = 256, chunk_interval_ms: float = 0.0) -> Starlette:
    """The upstream app; `slots` is only reported by /health, nothing is ever queued.

    With `chunk_interval_ms` > 0 chunks are paced (like tokens from a real engine), so each reaches a relay
    as its own read instead of coalescing with its neighbours in one TCP segment.
    """
    interval_s = chunk_interval_ms / 1000
    started = int(time.time())
    in_flight = 0

    totals = {"requests_total": 0, "prompt_tokens_total": 0, "generation_tokens_total": 0}

    async def health(_: Request) -> JSONResponse:
        # The same fields as the llama.cpp worker's /health (backends/llamacpp/worker/chat_server.py).
        return JSONResponse(
            {
                "status": "ok",
                "model": model_name,
                "n_ctx_per_slot": 1 << 20,
                "kv_cells_total": 0,
                "slots": slots,
                "slots_busy": in_flight,
                "queue_depth": 0,
                "kv_cells_used": 0,
                "kv_cells_cached": 0,
                "aborted_total": 0,
                "cached_prompt_tokens_total": 0,
                "tokens_per_second": 0.0,
                **totals,
            }
        )

    async def models(_: Request) -> JSONResponse:
        model = {"id": model_name, "object": "model", "created": started, "owned_by": "voltgate-bench"}
        return JSONResponse({"object": "list", "data": [model]})

    async def generate(request: Request) -> Response:
        nonlocal in_flight
        chat = request.url.path.endswith("/chat/completions")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        n = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        if not isinstance(n, int) or n < 1:
            return _error(400, "max_tokens must be a positive integer", "max_tokens")
        prompt_tokens = _prompt_tokens(body, chat)
        totals["requests_total"] += 1
        totals["prompt_tokens_total"] += prompt_tokens
        totals["generation_tokens_total"] += n
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        base = {"id": rid, "created": int(time.time()), "model": body.get("model") or model_name}
        if not body.get("stream"):
            text = TOKEN * n
            if chat:
                choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice["finish_reason"] = "length"
            obj = "chat.completion" if chat else "text_completion"
            return JSONResponse({**base, "object": obj, "choices": [choice], "usage": _usage(prompt_tokens, n)})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        obj = "chat.completion.chunk" if chat else "text_completion"

        def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            return b"data: " + json.dumps({**base, "object": obj, "choices": choices, **extra}).encode() + b"\n\n"

        if chat:
            first = frame([{"index": 0, "delta": {"role": "assistant", "content": TOKEN}, "finish_reason": None}])
            middle = frame([{"index": 0, "delta": {"content": TOKEN}, "finish_reason": None}])
            last = frame([{"index": 0, "delta": {"content": TOKEN}, "finish_reason": "length"}])
        else:
            first = middle = frame([{"index": 0, "text": TOKEN, "logprobs": None, "finish_reason": None}])
            last = frame([{"index": 0, "text": TOKEN, "logprobs": None, "finish_reason": "length"}])
        tail = frame([], usage=_usage(prompt_tokens, n)) if include_usage else b""

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal in_flight
            in_flight += 1
            try:
                for i in range(n):
                    if interval_s and i:
                        await asyncio.sleep(interval_s)
                    yield first if i == 0 else last if i == n - 1 else middle
                if tail:
                    yield tail
                yield b"data: [DONE]\n\n"
            finally:
                in_flight -= 1

        return StreamingResponse(chunks(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.zero_upstream", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-name", default="zero")
    p.add_argument("--slots", type=int, default=256)
    p.add_argument("--chunk-interval-ms", type=float, default=0.0, help="pause between chunks (0 = none)")
    args = p.parse_args(argv)
    uvicorn.run(
        create_app(args.model_name, args.slots, args.chunk_interval_ms),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
