"""The worker's OpenAI dialect: request bodies in, completion/chunk/error JSON out."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from backends.llamacpp.sampling import JSON_OBJECT_GBNF, SamplingParams
from backends.llamacpp.tickets import Usage

Kind = Literal["chat", "completion"]
ResponseFinish = Literal["stop", "length"]

ROLES = frozenset({"system", "user", "assistant"})


class WireError(Exception):
    """A request the worker cannot serve, rendered as an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ParsedRequest:
    """The parts of a (gateway-validated) OpenAI request body this worker honours."""

    kind: Kind
    messages: tuple[dict[str, str], ...] | None
    prompt: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    stop: tuple[str, ...]
    sampling: SamplingParams


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise WireError(400, f"'{name}' must be a number in [{lo}, {hi}]", param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, lo: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise WireError(400, f"'{name}' must be an integer >= {lo}", param=name)
    return value


def _messages(body: dict[str, Any]) -> tuple[dict[str, str], ...]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise WireError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise WireError(400, f"messages[{i}] needs a role of {sorted(ROLES)}", param=f"messages[{i}]")
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise WireError(400, f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        out.append({"role": str(message["role"]), "content": content})
    return tuple(out)


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    raw = body.get("stop")
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return tuple(s for s in raw if s)
    raise WireError(400, "'stop' must be a string or a list of strings", param="stop")


def _grammar(body: dict[str, Any]) -> str | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_GBNF
    raise WireError(400, "response_format.type must be 'text' or 'json_object'", param="response_format")


def parse_request(kind: Kind, body: Any) -> ParsedRequest:
    """Read what this worker honours from a request body; unknown fields are ignored."""
    if not isinstance(body, dict):
        raise WireError(400, "the request body must be a JSON object")
    messages = prompt = None
    if kind == "chat":
        messages = _messages(body)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise WireError(400, "'prompt' must be a string", param="prompt")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    max_tokens = _integer(body, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens", 1)
    seed = _integer(body, "seed", -(2**63))
    sampling = SamplingParams(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=int(_number(body, "top_k", 0, 0, 1e9)),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        seed=secrets.randbits(32) if seed is None else seed & 0xFFFFFFFF,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 1e-3, 10.0),
        grammar=_grammar(body),
        ignore_eos=bool(body.get("ignore_eos", False)),
    )
    return ParsedRequest(
        kind=kind,
        messages=messages,
        prompt=prompt,
        stream=bool(body.get("stream", False)),
        include_usage=include_usage,
        max_tokens=max_tokens,
        stop=_stop(body),
        sampling=sampling,
    )


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@dataclass(frozen=True)
class Renderer:
    """Renders one response's JSON objects; every object carries the same id, created and model."""

    kind: Kind
    id: str
    created: int
    model: str
    include_usage: bool = False

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def completion(self, text: str, finish_reason: ResponseFinish, usage: Usage) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion")
        body["choices"] = [choice]
        body["usage"] = usage_body(usage)
        return body

    def chunk(self, text: str | None, finish_reason: ResponseFinish | None = None) -> dict[str, Any]:
        """A streamed delta; for chat, `text=None` is the opening role delta and finish sends `{}`."""
        if self.kind == "chat":
            if finish_reason is not None:
                delta: dict[str, Any] = {}
            elif text is None:
                delta = {"role": "assistant", "content": ""}
            else:
                delta = {"content": text}
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion")
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = usage_body(usage)
        return body


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")
