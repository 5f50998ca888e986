"""Parity of the typed translation with the dict one it replaced: the same client requests (Messages,
count_tokens, Responses) through either tree, printed as JSON (the chat request, the engine request's wire
body, or the refusal's status, code, param and message). Run it against each tree (README.md)."""

import json
import sys

from gateway.errors import GatewayError
from gateway.protocol.anthropic import CountTokensRequest, MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.parsing import parse_body
from gateway.protocol.responses_api import ResponsesRequest
from gateway.translate import messages, responses

NEW = hasattr(__import__("gateway.translate.params", fromlist=["x"]), "translated")
if not NEW:
    from gateway.translate.params import MESSAGES, RESPONSES, chat_request, translated_request

W = {
    "name": "get_weather",
    "description": "Weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
RW = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object"},
    "strict": True,
}
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
IMG = f"data:image/png;base64,{PIXEL}"
U = [{"role": "user", "content": "hi"}]


def M(**f):
    return {"model": "smol", "max_tokens": 64, "messages": U, **f}


TOOLTURNS = [
    {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "18C"},
            {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "x"}], "is_error": True},
            {"type": "text", "text": "more"},
        ],
    },
]
MCASES = [
    M(),
    M(
        system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        stop_sequences=["END"],
        temperature=0.3,
        top_p=0.9,
        top_k=4,
        metadata={"user_id": "u"},
        stream=True,
    ),
    M(tools=[W], messages=TOOLTURNS),
    M(tools=[W], messages=TOOLTURNS, stream=True),
    *[
        M(tools=[W], tool_choice=c)
        for c in (
            {"type": "auto"},
            {"type": "any"},
            {"type": "none"},
            {"type": "tool", "name": "get_weather"},
            {"type": "auto", "disable_parallel_tool_use": True},
            {"type": "tool", "name": "nope"},
            {"type": "tool"},
        )
    ],
    M(tool_choice={"type": "any"}),
    M(tool_choice={"type": "auto"}),
    M(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}}),
    M(
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": IMG.split(",")[1]},
                    },
                    {"type": "text", "text": "what"},
                ],
            }
        ]
    ),
    M(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]),
    M(stop_sequences=[str(i) for i in range(17)]),
    M(stop_sequences=[]),
    M(messages=[{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]),
    M(
        messages=[
            {"role": "user", "content": "Count"},
            {"role": "assistant", "content": [{"type": "text", "text": "1"}]},
        ]
    ),
    M(messages=[*U, {"role": "system", "content": "sys"}]),
    M(
        messages=[
            *U,
            {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "ok"},
        ]
    ),
    M(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "1"}]}]),
    M(temperature=1.5),
    M(max_tokens=0),
    M(thinking={"type": "enabled", "budget_tokens": 10}),
    M(
        tools=[{**W, "strict": True}, {"name": "b", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "b"},
    ),
    M(
        tools=[W],
        messages=[
            *U,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {"a": "é"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ],
    ),
    M(messages=[{"role": "assistant", "content": "first"}, *U]),
    M(tools=[W], tool_choice={"type": "tool", "name": "get_weather"}, stream=True, stop_sequences=["a", "b"]),
]
CCASES = [
    {"model": "smol", "messages": U, "tools": [W]},
    {"model": "smol", "system": "S", "messages": TOOLTURNS, "tools": [W], "tool_choice": {"type": "any"}},
]


def R(**f):
    return {"model": "smol", "input": "hi", **f}


NS = {
    "type": "namespace",
    "name": "multi",
    "tools": [
        {"type": "function", "name": "spawn", "parameters": {"type": "object"}},
        {"type": "function", "name": "close"},
    ],
}
LONG = {"type": "namespace", "name": "n" * 60, "tools": [{"type": "function", "name": "f" * 20}]}
RCASES = [
    (R(instructions="Be terse."), []),
    (
        R(
            tools=[RW],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            max_output_tokens=64,
            temperature=0.2,
            top_p=0.9,
            user="u1",
            stream=True,
            text={
                "format": {
                    "type": "json_schema",
                    "name": "city",
                    "schema": {"type": "object"},
                    "strict": True,
                    "description": "d",
                }
            },
        ),
        [],
    ),
    (R(text={"format": {"type": "json_object"}}, tools=[RW], tool_choice="required"), []),
    (R(text={"format": {"type": "text"}}), []),
    (
        R(
            input=[
                {"role": "developer", "content": "French."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "Salut", "annotations": []},
                        {"type": "refusal", "refusal": "no"},
                    ],
                },
                {"role": "system", "content": "s"},
                {"role": "user", "content": "Again"},
            ]
        ),
        [],
    ),
    (R(input=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]), []),
    (R(input=[{"type": "function_call_output", "call_id": "c", "output": "1"}]), []),
    (R(tools=[RW, NS], tool_choice={"type": "function", "name": "multi.spawn"}), []),
    (R(tools=[LONG]), []),
    (R(tools=[LONG], tool_choice={"type": "function", "name": "n" * 60 + "." + "f" * 20}), []),
    (
        R(
            tools=[RW],
            input=[
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "25C"}]}
            ],
        ),
        [
            {"type": "message", "role": "user", "content": "Check"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}", "id": "fc_1"},
        ],
    ),
    (
        R(
            tools=[RW],
            input=[
                {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call", "call_id": "b", "name": "spawn", "namespace": "multi", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "a", "output": "x"},
                {"type": "function_call_output", "call_id": "b", "output": "y"},
            ],
        ),
        [],
    ),
    (
        R(
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "what"}, {"type": "input_image", "image_url": IMG}],
                }
            ]
        ),
        [],
    ),
    (R(input=[{"role": "user", "content": [{"type": "input_image", "image_url": IMG, "detail": "low"}]}]), []),
    (R(input=[{"type": "reasoning", "id": "rs", "summary": []}, {"role": "user", "content": "Hi"}]), []),
    (R(tools=[RW], tool_choice={"type": "function", "name": "missing"}), []),
    (R(tool_choice="required"), []),
    (R(tool_choice="none"), []),
    (R(tool_choice="auto", tools=[RW]), []),
    (R(temperature=3), []),
    (R(max_output_tokens=0), []),
    (R(input=[{"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"}]), []),
    (R(previous_response_id="resp_x", input="t"), [{"type": "function_call_output", "call_id": "zz", "output": "1"}]),
]


def outcome(make, *args):
    try:
        chat = make(*args)
    except GatewayError as e:
        return {"error": [e.status, e.code.value, e.param, e.message]}
    try:
        engine = chat.to_engine(EngineTarget(model="w")).wire()
    except GatewayError as e:
        engine = {"error": [e.status, e.code.value, e.param, e.message]}
    return {"type": type(chat).__name__, "chat": chat.model_dump(mode="json"), "engine": engine}


def run_m(body, kind):
    req = parse_body(json.dumps(body).encode(), kind, dotted=True)
    if NEW:
        return messages.to_chat(req)
    chat = messages.to_chat(req)
    if kind is CountTokensRequest:
        chat = {**chat, "max_tokens": 1}
    return translated_request(chat, MESSAGES, messages.MessagesChatRequest)


def run_r(body, history):
    req = parse_body(json.dumps(body).encode(), ResponsesRequest)
    if NEW:
        return responses.to_chat(req, history)
    return chat_request(responses.to_chat(req, history), RESPONSES)


def main() -> None:
    out = {}
    for i, b in enumerate(MCASES):
        out[f"m{i}"] = outcome(run_m, b, MessagesRequest)
    for i, b in enumerate(CCASES):
        out[f"c{i}"] = outcome(run_m, b, CountTokensRequest)
    for i, (b, h) in enumerate(RCASES):
        out[f"r{i}"] = outcome(run_r, b, h)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
