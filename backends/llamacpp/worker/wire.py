"""The worker's OpenAI dialect: request bodies in, completion/chunk/error JSON out."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from backends.llamacpp.worker.httpkit import invalid
from backends.llamacpp.worker.sampling import JSON_OBJECT_GBNF, SamplingParams
from backends.llamacpp.worker.tickets import Usage
from backends.llamacpp.worker.tools import schema_grammar
from backends.request import EngineRequest

Kind = Literal["chat", "completion"]
ResponseFinish = Literal["stop", "length", "tool_calls"]


def sampling_params(request: EngineRequest, grammar: str | None, *, choice: int = 0) -> SamplingParams:
    """The sampler settings for choice `choice` of a validated request (OpenAI's defaults where it gave
    none). With a seed, choice i samples with seed + i: reproducible, and the choices differ."""
    seed = None if request.seed is None else request.seed + choice
    return SamplingParams(
        temperature=_or(request.temperature, 1.0),
        top_p=_or(request.top_p, 1.0),
        top_k=request.top_k or 0,
        min_p=_or(request.min_p, 0.0),
        seed=secrets.randbits(32) if seed is None else seed & 0xFFFFFFFF,
        presence_penalty=_or(request.presence_penalty, 0.0),
        frequency_penalty=_or(request.frequency_penalty, 0.0),
        repetition_penalty=_or(request.repetition_penalty, 1.0),
        grammar=grammar,
        ignore_eos=request.ignore_eos,
    )


def logit_bias(request: EngineRequest, n_vocab: int) -> tuple[tuple[int, float], ...]:
    """The request's logit biases, checked against the vocabulary (a 400 naming the bad token id)."""
    if not request.logit_bias:
        return ()
    for token in request.logit_bias:
        if not 0 <= token < n_vocab:
            raise invalid(f"logit_bias: token id {token} is not in this model's vocabulary (0..{n_vocab - 1})",
                          param="logit_bias")  # fmt: skip
    return tuple(sorted(request.logit_bias.items()))


def _or(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def format_grammar(request: EngineRequest) -> str | None:
    """The grammar `response_format` asks for (JSON mode, or a JSON schema), if any."""
    fmt = request.response_format
    if fmt is None or fmt.type == "text" or not request.is_chat:
        return None
    if fmt.type == "json_object" or fmt.json_schema is None:
        return JSON_OBJECT_GBNF
    return schema_grammar(fmt.json_schema.schema_)


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def usage_body(usage: Usage, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object; `completion_tokens_details.reasoning_tokens` when the model reasons."""
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


@dataclass(frozen=True)
class Renderer:
    """Renders one response's JSON objects; every object carries the same id, created and model.

    Chunks never carry `"usage": null`: usage is a final chunk of its own (`choices: []`), sent only when
    the request asked for it, as OpenAI's schema has it (and, asked with `include_prompt_usage`, on the
    first chunk: the prompt's counts, 0 completion tokens).

    A choice that a stop string ended carries `"stop_reason": "<that string>"` beside its `finish_reason`
    (the whole choice, or a stream's finishing chunk), as vLLM sends it; every other choice leaves the field
    out (vLLM sends null there), so its keys stay OpenAI's own.
    """

    kind: Kind
    id: str
    created: int
    model: str

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def completion(
        self, choices: Sequence[dict[str, Any]], usage: Usage, reasoning_tokens: int | None = None
    ) -> dict[str, Any]:
        """The unary body for fully built `choices` (see `chat_choice` / `text_choice`)."""
        body = self._envelope("chat.completion" if self.kind == "chat" else "text_completion")
        body["choices"] = list(choices)
        body["usage"] = usage_body(usage, reasoning_tokens)
        return body

    @staticmethod
    def chat_choice(
        index: int,
        content: str | None,
        finish_reason: ResponseFinish,
        tool_calls: Sequence[dict[str, Any]] = (),
        logprobs: dict[str, Any] | None = None,
        *,
        stop_reason: str | None = None,
        reasoning: str | None = None,
    ) -> dict[str, Any]:
        """A whole chat choice; `reasoning` (the thinking) goes in `message.reasoning_content` when given."""
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = list(tool_calls)
        choice = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        return _with_stop(choice, stop_reason)

    @staticmethod
    def text_choice(
        index: int,
        text: str,
        finish_reason: ResponseFinish | None,
        logprobs: dict[str, Any] | None = None,
        *,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return _with_stop(choice, stop_reason)

    def chunk(
        self,
        delta: dict[str, Any],
        finish_reason: ResponseFinish | None = None,
        *,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        """A streamed chat delta (`{"role": ...}`, `{"content": ...}`, `{"tool_calls": [...]}` or `{}`)."""
        body = self._envelope("chat.completion.chunk")
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        body["choices"] = [_with_stop(choice, stop_reason)]
        return body

    def text_chunk(
        self,
        text: str,
        finish_reason: ResponseFinish | None = None,
        *,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        """A streamed text-completion piece."""
        body = self._envelope("text_completion")
        body["choices"] = [self.text_choice(index, text, finish_reason, logprobs, stop_reason=stop_reason)]
        return body

    def usage_chunk(self, usage: Usage, reasoning_tokens: int | None = None) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = usage_body(usage, reasoning_tokens)
        return body


def _with_stop(choice: dict[str, Any], stop_reason: str | None) -> dict[str, Any]:
    """`choice` with vLLM's `stop_reason` (the stop string that ended it) when one did."""
    if stop_reason is not None:
        choice["stop_reason"] = stop_reason
    return choice


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")
