"""Parity of the typed non-streamed answer with the dict one it replaced: the same worker answers through a
tree's `UnaryCall.run` and each API's renderer (chat: none, the pass-through; Messages: the route's
`_render_message` and `_render_count`; Responses: the route's `_Turn.render`), printed as JSON: the bytes the
client gets (`JSONResponse(body).body`), the accounted status and tokens, or the error. A few streams go
through `MessagesStream` / `ResponsesStream` too (their usage is typed now). Ids and clocks are made
deterministic, so the outputs of two trees compare with `cmp`. Run it against each tree (README.md)."""

import asyncio
import copy
import itertools
import json
import sys
import time
from types import SimpleNamespace

from starlette.responses import JSONResponse

import gateway.routes.messages as mroute
import gateway.routes.responses as rroute
import gateway.translate.messages_stream as mstream
import gateway.translate.responses as rtrans
import gateway.translate.responses_stream as rstream
from backends.request import RequestKind
from gateway.errors import GatewayError
from gateway.protocol.anthropic import CountTokensRequest, MessagesRequest
from gateway.protocol.parsing import parse_body
from gateway.protocol.responses import ChatCompletionChunk
from gateway.protocol.responses_api import ResponsesRequest
from gateway.serving.unary import UnaryCall
from gateway.translate import MessagesStream, ResponsesStream

time.time = lambda: 1_700_000_002.0  # Responses' completed_at
COUNTER = itertools.count()


def fixed_id(prefix: str) -> str:
    return f"{prefix}_{next(COUNTER)}"


for module in (mroute, rtrans, rstream, mstream):
    module.new_id = fixed_id

U = [{"role": "user", "content": "hi"}]
W = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
RW = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
NS = {"type": "namespace", "name": "multi", "tools": [{"type": "function", "name": "spawn"}]}
MREQS = {
    "plain": {"model": "smol", "max_tokens": 64, "messages": U},
    "stops": {"model": "smol", "max_tokens": 64, "messages": U, "stop_sequences": ["END", "\n\nHuman:"]},
    "tools": {"model": "smol", "max_tokens": 64, "messages": U, "tools": [W]},
}
RREQS = {
    "plain": {"model": "smol", "input": "hi"},
    "settings": {
        "model": "smol",
        "input": "hi",
        "instructions": "Be terse.",
        "tools": [RW, NS],
        "tool_choice": "auto",
        "max_output_tokens": 64,
        "temperature": 0.2,
        "user": "u1",
        "metadata": {"k": "v"},
        "text": {"format": {"type": "json_object"}},
    },
}


def call(cid, name, arguments):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def answer(message, finish="stop", usage=True, **choice):
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "smol-served",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, **choice}],
    }
    if usage is True:
        body["usage"] = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    elif usage:
        body["usage"] = usage
    return body


ANSWERS = {
    "text": answer({"content": "Hello!"}),
    "text_llamacpp_worker": answer(
        {"content": "Hello!"},
        logprobs=None,
        usage={
            "prompt_tokens": 20,
            "completion_tokens": 7,
            "total_tokens": 27,
            "prompt_tokens_details": {"cached_tokens": 12},
        },
    ),
    "text_no_usage": answer({"content": "Hello!"}, usage=None),
    "text_usage_extras": answer(
        {"content": "x"},
        usage={
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "total_tokens": 0,
            "prompt_tokens_details": {"audio_tokens": 0, "cached_tokens": 3},
            "completion_tokens_details": {"reasoning_tokens": 1},
        },
    ),
    "empty_text": answer({"content": ""}),
    "null_content": answer({"content": None}),
    "tool_calls": answer(
        {
            "content": None,
            "tool_calls": [call("call_1", "get_weather", '{"city": "Oslo"}'), call("call_2", "get_weather", "")],
        },
        "tool_calls",
    ),
    "text_and_tool_call": answer(
        {"content": "On it.", "tool_calls": [call("call_3", "get_weather", "{}")]}, "tool_calls"
    ),
    "tool_call_no_id": answer({"tool_calls": [call("", "get_weather", "{}")]}, "tool_calls"),
    "namespace_call": answer({"tool_calls": [call("call_4", "multi.spawn", "{}")]}, "tool_calls"),
    "tool_call_stop_finish": answer({"tool_calls": [call("call_5", "get_weather", "{}")]}, "stop"),
    "function_call_finish": answer({"content": "x"}, "function_call"),
    "length": answer({"content": "Once upon"}, "length"),
    "length_cut_arguments": answer({"tool_calls": [call("call_6", "get_weather", '{"city": "Os')]}, "length"),
    "bad_arguments": answer({"tool_calls": [call("call_7", "get_weather", "[1, 2]")]}, "tool_calls"),
    "refusal": answer({"content": None, "refusal": "I can't."}),
    "content_filter": answer({"content": "partial"}, "content_filter"),
    "stop_vllm_string": answer({"content": "Count: 1 2"}, stop_reason="END"),
    "stop_vllm_other_string": answer({"content": "x"}, stop_reason="OTHER"),
    "stop_vllm_token_id": answer({"content": "x"}, stop_reason=32000),
    "stop_vllm_null": answer({"content": "x"}, stop_reason=None),
    "stop_sglang": answer({"content": "Count: 1 2"}, matched_stop="END"),
    "stop_sglang_human": answer({"content": "x"}, matched_stop="\n\nHuman:"),
    "stop_reason_odd_type": answer({"content": "x"}, stop_reason=["END"]),
    "reasoning_and_extras": {
        **answer({"content": "4", "reasoning_content": "2+2"}),
        "system_fingerprint": "fp",
        "service_tier": "default",
        "prompt_logprobs": None,
    },
    "logprobs": answer(
        {"content": "a"}, logprobs={"content": [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}]}
    ),
    "two_choices": {
        **answer({"content": "one"}),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "one"}, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "two"}, "finish_reason": "length"},
        ],
    },
    "no_choices": {**answer({"content": "x"}), "choices": []},
    "missing_id": {k: v for k, v in answer({"content": "x"}).items() if k != "id"},
    "bad_finish": answer({"content": "x"}, "abort"),
}


class Scope:
    def __init__(self, kind):
        self.ctx = SimpleNamespace(kind=kind)
        self.finished = None

    async def schedule(self, fn, wait_s):
        del wait_s
        return await fn()

    def finish(self, status, tokens, error=None):
        self.finished = {
            "status": status,
            "tokens": list(tokens) if tokens else tokens,
            "error": [error.status, error.code.value, error.message] if error else None,
        }


class Upstream:
    def __init__(self, data):
        self.data = data

    async def post(self, request):
        del request
        return copy.deepcopy(self.data)


async def never():
    await asyncio.Event().wait()


async def through(kind, data, translate):
    global COUNTER
    COUNTER = itertools.count()
    scope = Scope(kind)
    out = {}
    try:
        result = await UnaryCall(scope, upstream=Upstream(data), request=None, load_wait_s=None).run(never, translate)
        out["body"] = JSONResponse(result.body).body.decode()
    except GatewayError as exc:
        out["raised"] = [exc.status, exc.code.value, exc.message]
    out["accounted"] = scope.finished
    return out


def messages_render(name):
    req = parse_body(json.dumps(MREQS[name]).encode(), MessagesRequest, dotted=True)
    return lambda chat: mroute._render_message(req, chat)


def count_render():
    req = parse_body(json.dumps({"model": "smol", "messages": U}).encode(), CountTokensRequest, dotted=True)
    return lambda chat: mroute._render_count(req, chat)


def responses_render(name):
    req = parse_body(json.dumps(RREQS[name]).encode(), ResponsesRequest)
    return rroute._Turn(req, None, "owner", "resp_1", 1_700_000_000).render


async def unary_cases():
    out = {}
    for name, data in ANSWERS.items():
        out[f"{name}/chat"] = await through(RequestKind.CHAT, data, None)
        for m in MREQS:
            out[f"{name}/messages.{m}"] = await through(RequestKind.CHAT, data, messages_render(m))
        out[f"{name}/count_tokens"] = await through(RequestKind.CHAT, data, count_render())
        for r in RREQS:
            out[f"{name}/responses.{r}"] = await through(RequestKind.CHAT, data, responses_render(r))
    completion = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "system_fingerprint": "x",
        "choices": [{"index": 0, "text": "t", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    out["completion"] = await through(RequestKind.COMPLETION, completion, None)
    rerank = {
        "model": "r",
        "results": [{"index": 1, "relevance_score": 0.5}, {"index": 0, "relevance_score": 0.9}],
        "usage": {"prompt_tokens": 6, "total_tokens": 6},
    }
    out["rerank"] = await through(RequestKind.RERANK, rerank, None)
    embedding = {
        "object": "list",
        "model": "e",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
    out["embedding"] = await through(RequestKind.EMBEDDING, embedding, None)
    return out


def chunk(delta=None, finish=None, usage=None, **choice):
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "smol-served", "choices": []}
    if delta is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish, **choice}]
    if usage is not None:
        body["usage"] = usage
    return ChatCompletionChunk.model_validate(body)


USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 4}}
STREAMS = {
    "text_usage": [
        chunk({"role": "assistant", "content": ""}, usage={**USAGE, "completion_tokens": 0}),
        chunk({"content": "Hi"}),
        chunk({}, "stop"),
        chunk(usage=USAGE),
    ],
    "tool_stop_vllm": [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ]
            }
        ),
        chunk({}, "stop", stop_reason="END"),
    ],
    "stop_sglang_no_usage": [chunk({"content": "x"}), chunk({}, "stop", matched_stop="END")],
}


def stream_cases():
    global COUNTER
    out = {}
    for name, chunks in STREAMS.items():
        COUNTER = itertools.count()
        req = parse_body(json.dumps(MREQS["stops"]).encode(), MessagesRequest, dotted=True)
        m = MessagesStream(req, message_id="msg_s")
        events = m.start() + [e for c in chunks for e in m.feed(c)] + m.finish()
        out[f"stream/{name}/messages"] = {"events": events, "final": m.final_message()}
        COUNTER = itertools.count()
        rreq = parse_body(json.dumps(RREQS["settings"]).encode(), ResponsesRequest)
        r = ResponsesStream(rreq, response_id="resp_s", created_at=1)
        events = r.start() + [e for c in chunks for e in r.feed(c)] + r.finish(completed_at=2)
        out[f"stream/{name}/responses"] = {"events": events}
    return out


def main() -> None:
    out = asyncio.run(unary_cases())
    out.update(stream_cases())
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
