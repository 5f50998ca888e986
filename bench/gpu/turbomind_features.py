"""On the GPU machine: what voltgate's TurboMind path accepts and returns, through `voltgate serve`.

    python3 -m bench.gpu.turbomind_features --base-url http://127.0.0.1:8000 --model tm --out RESULTS/features.jsonl

Random weights make the text gibberish, so each check asserts acceptance, OpenAI's (or Anthropic's) shapes
and what a grammar or a forced choice guarantees: a `tool_calls` entry naming the forced tool, a JSON
schema's output, `n` choices, logprobs present, a 400 naming the parameter where TurboMind cannot honour it.
One JSON line per check: {"check", "ok", "status", "detail"}.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import httpx

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": CITY}}
OTHER = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip


class Checks:
    def __init__(self, base: str, model: str, out: Any) -> None:
        self.http = httpx.Client(base_url=base, timeout=180)
        self.model = model
        self.out = out
        self.failed = 0

    def chat(self, **body: Any) -> httpx.Response:
        return self.http.post("/v1/chat/completions", json={"model": self.model, "messages": ASK, **body})

    def record(self, name: str, response: httpx.Response, ok: bool, detail: Any = None) -> None:
        line = {"check": name, "ok": bool(ok), "status": response.status_code, "detail": detail or response.text[:600]}
        self.failed += not ok
        print(json.dumps(line), file=self.out, flush=True)
        print(("PASS " if ok else "FAIL ") + name, file=sys.stderr)

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # a check that breaks is a failed check, the others still run
            self.failed += 1
            print(json.dumps({"check": name, "ok": False, "status": None, "detail": repr(exc)[:600]}), file=self.out)


def stream_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


def tool_checks(c: Checks) -> None:
    r = c.chat(tools=[TOOL, OTHER], max_tokens=64)
    c.record("tools_auto_accepted", r, r.status_code == 200)
    r = c.chat(tools=[TOOL], tool_choice="required", max_tokens=64)
    calls = r.json()["choices"][0]["message"].get("tool_calls") if r.status_code == 200 else None
    c.record("tools_required_calls", r, bool(calls) and calls[0]["function"]["name"] == "get_weather"
             and calls[0]["id"] and calls[0]["type"] == "function", calls)  # fmt: skip
    named = {"type": "function", "function": {"name": "get_time"}}
    r = c.chat(tools=[TOOL, OTHER], tool_choice=named, max_tokens=64)
    calls = r.json()["choices"][0]["message"].get("tool_calls") if r.status_code == 200 else None
    c.record("tools_named_calls_that_tool", r, bool(calls) and {x["function"]["name"] for x in calls} == {"get_time"},
             calls)  # fmt: skip
    r = c.chat(tools=[TOOL], tool_choice="required", max_tokens=64, stream=True)
    parts = [
        p for ch in stream_chunks(r) if ch.get("choices") for p in ch["choices"][0]["delta"].get("tool_calls") or []
    ]
    c.record("tools_streamed_deltas", r, r.status_code == 200 and bool(parts) and bool(parts[0].get("id")), parts[:3])
    r = c.chat(tools=[TOOL], tool_choice="none", max_tokens=16)
    c.record("tools_none_no_call", r, r.status_code == 200 and not r.json()["choices"][0]["message"].get("tool_calls"))


def format_checks(c: Checks) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    r = c.chat(response_format=fmt, max_tokens=96)
    content = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
    try:
        value = json.loads(content)
        ok = set(value) == {"name", "age"} and isinstance(value["age"], int)
    except ValueError:
        ok = False
    c.record("json_schema_output_follows_schema", r, ok, content[:300])
    r = c.chat(response_format={"type": "json_object"}, max_tokens=48)
    c.record("json_object_accepted", r, r.status_code == 200)


def sampling_checks(c: Checks) -> None:
    r = c.chat(max_tokens=4, logprobs=True, top_logprobs=3)
    lp = r.json()["choices"][0].get("logprobs") if r.status_code == 200 else None
    c.record("chat_logprobs_present", r, bool(lp and lp.get("content") and len(lp["content"][0]["top_logprobs"]) == 3),
             lp)  # fmt: skip
    r = c.chat(max_tokens=4, n=2, temperature=0.8)
    body = r.json() if r.status_code == 200 else {}
    c.record("n_two_choices", r, [ch["index"] for ch in body.get("choices", [])] == [0, 1], body.get("usage"))
    r = c.chat(max_tokens=4, logit_bias={"5": -100})
    c.record("logit_bias_accepted", r, r.status_code == 200)
    r = c.http.post("/v1/completions", json={"model": c.model, "prompt": "hi", "max_tokens": 4, "logprobs": 2})
    c.record(
        "completions_logprobs_refused_by_name", r, r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    )


def api_checks(c: Checks) -> None:
    r = c.http.post("/v1/responses", json={"model": c.model, "input": "hi", "max_output_tokens": 8})
    c.record("responses_create", r, r.status_code == 200 and r.json().get("object") == "response")
    r = c.http.post("/v1/responses", json={"model": c.model, "input": "hi", "max_output_tokens": 8, "stream": True})
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    c.record("responses_stream_events", r, events[:2] == ["response.created", "response.in_progress"]
             and events[-1] in ("response.completed", "response.incomplete"), events[:12])  # fmt: skip
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}]
    r = c.http.post("/v1/responses", json={"model": c.model, "input": "Weather in Paris?", "tools": tools,
                                            "tool_choice": "required", "max_output_tokens": 64})  # fmt: skip
    items = r.json().get("output", []) if r.status_code == 200 else []
    c.record("responses_function_call_item", r, any(i.get("type") == "function_call" for i in items), items[:2])
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "unused"}
    body = {"model": c.model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    r = c.http.post("/v1/messages", json=body, headers=headers)
    c.record("messages_create", r, r.status_code == 200 and r.json().get("type") == "message")
    r = c.http.post("/v1/messages", json={**body, "stream": True}, headers=headers)
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    c.record("messages_stream_events", r, events[:1] == ["message_start"] and events[-1] == "message_stop", events[:10])
    tool_body = {**body, "max_tokens": 64, "tools": [{"name": "get_weather", "input_schema": CITY}],
                 "tool_choice": {"type": "tool", "name": "get_weather"}}  # fmt: skip
    r = c.http.post("/v1/messages", json=tool_body, headers=headers)
    reply = r.json() if r.status_code == 200 else {}
    blocks = reply.get("content", [])
    # A forced call cut by max_tokens (random weights rarely close the JSON) is stop_reason max_tokens, its text kept.
    cut = reply.get("stop_reason") == "max_tokens" and any(b.get("type") == "text" for b in blocks)
    c.record("messages_tool_use_block", r, cut or any(b.get("type") == "tool_use" for b in blocks),
             {"stop_reason": reply.get("stop_reason"), "content": blocks[:2]})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "w") as out:
        checks = Checks(args.base_url, args.model, out)
        for name, fn in (("tools", tool_checks), ("formats", format_checks), ("sampling", sampling_checks),
                         ("apis", api_checks)):  # fmt: skip
            checks.run(name, lambda fn=fn: fn(checks))
    print(f"{checks.failed} failed", file=sys.stderr)


if __name__ == "__main__":
    main()
