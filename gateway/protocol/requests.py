"""Request bodies for /v1/chat/completions, /v1/completions and /v1/embeddings, validated strictly.

What no engine here can honour (audio and file parts, images outside user messages, legacy functions, ...) is
refused with a 400 that names the parameter; nothing a client asked for is silently dropped. Unknown top-level
fields that carry no meaning for generation (e.g. `metadata` from chat frontends) are ignored, like OpenAI's
own API does.

Each request type crosses the seam to the engine itself: `check(capabilities, label)` refuses what the
deployment cannot honour, `to_engine(target)` builds the engine's typed request (`backends.request`).
Mapping that belongs to the gateway happens there, once: the `developer` role becomes `system` (every chat
template knows `system`), content parts are flattened to text (an image part leaves `IMAGE_MARKER`; the images,
checked by `gateway.serving.vision_parts`, ride in `images`), `max_completion_tokens` wins over
`max_tokens`, the server's length defaults apply, the engine is always asked for usage when streaming (for
exact token metrics), and the public model name becomes the one the worker knows.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from backends.base import EngineCapabilities
from backends.request import (
    MAX_INPUTS,
    STOP_LIMIT,
    Choices,
    Count,
    EngineEmbeddingRequest,
    EngineRequest,
    LogitBias,
    MaxTokens,
    MinP,
    Penalty,
    RepetitionPenalty,
    RequestKind,
    ResponseFormat,
    Seed,
    StopString,
    Temperature,
    TokenId,
    Tool,
    ToolChoice,
    TopK,
    TopLogprobs,
    TopP,
)
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.chat_messages import (  # noqa: F401  (re-exported: the wire types' one home)
    AssistantMessage,
    ContentPart,
    FunctionMessage,
    ImageUrl,
    ImageUrlPart,
    Message,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
    _Body,
    _Message,
    _OtherPart,
    _Strict,
)
from gateway.protocol.engine_requests import EngineTarget, check_kind, refuse
from gateway.protocol.parsing import parse_body, validation_error
from gateway.protocol.reasoning import Effort, ReasoningAsk, resolve

ThinkingBudget = Annotated[int, Field(ge=0)]  # thinking tokens before the worker closes the thinking (0: none)

SPELLINGS = {"repeat_penalty": "repetition_penalty", "num_predict": "max_tokens", "n_predict": "max_tokens"}

# Generation settings other servers take and ours do not: refused by name, never silently ignored.
UNSUPPORTED_SAMPLING = frozenset({
    "mirostat", "mirostat_tau", "mirostat_eta", "tfs_z", "typical_p", "repeat_last_n", "penalty_last_n",
    "dynatemp_range", "dynatemp_exponent", "dry_multiplier", "dry_base", "dry_allowed_length", "xtc_probability",
    "xtc_threshold", "top_a", "top_n_sigma", "num_ctx", "num_keep", "penalize_newline", "typical",
    "length_penalty", "early_stopping", "use_beam_search", "min_tokens", "guided_json", "guided_regex",
    "guided_grammar", "grammar",
})  # fmt: skip


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class _Sampling(BaseModel):
    """Fields shared by chat and text completions; ranges as OpenAI documents them, shared with the engine
    request (`backends.request`) so that the gateway and the workers can never disagree on a bound.
    Unknown top-level fields are kept aside (`extra="allow"`) only to refuse generation settings we lack."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Choices | None = None
    stop: StopString | list[StopString] | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[Annotated[int, Field(ge=0)], LogitBias] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None  # a session hint (gateway.serving.prompt_prefix), never sent on
    # Extensions understood by both engines (LMDeploy and our llama.cpp worker).
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _frontend_spellings(cls, data: Any) -> Any:
        """Names chat frontends send for our parameters (Ollama/llama.cpp spellings) become ours."""
        if not isinstance(data, dict):
            return data
        for theirs, ours in SPELLINGS.items():
            if theirs in data:
                data = dict(data)
                value = data.pop(theirs)
                if ours in data and data[ours] != value:
                    raise ValueError(f"both {theirs!r} and {ours!r} given with different values")
                data[ours] = value
        return data

    @field_validator("stop")
    @classmethod
    def _stop_limit(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > STOP_LIMIT:
            raise ValueError(f"at most {STOP_LIMIT} stop sequences")
        return stop

    @field_validator("stream", mode="before")
    @classmethod
    def _null_stream(cls, value: Any) -> Any:
        return False if value is None else value  # OpenAI's schema allows `"stream": null`: not streamed

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return options

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, reason) for each requested feature no engine here can honour."""
        return [
            (name, f"{name!r} is not supported by voltgate's engines; leave it out")
            for name in sorted(UNSUPPORTED_SAMPLING & set(self.model_extra or {}))
        ]

    def token_limit(self) -> int | None:
        return self.max_tokens

    def _limit_param(self) -> str:
        return "max_tokens"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def units(self) -> int:
        """Admission slots: one per choice (`n`), as the worker runs each in a slot."""
        return self.n or 1

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def _sampling(self) -> dict[str, Any]:
        fields = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                  "repetition_penalty")  # fmt: skip
        out = {name: getattr(self, name) for name in fields if getattr(self, name) is not None}
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.n is not None:
            out["n"] = self.n
        if self.logit_bias:
            out["logit_bias"] = self.logit_bias
        return out

    def _engine(self, target: EngineTarget, inputs: dict[str, Any]) -> EngineRequest:
        """The engine request with `inputs` (messages or prompt and what goes with them), the model's sampling
        defaults for the fields the request leaves out; a combination it refuses is a 400 naming it."""
        body: dict[str, Any] = {"model": target.model, "stream": self.stream, "stop": self.stops(),
                                **target.sampling, **self._sampling(), **inputs}  # fmt: skip
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        limit = target.max_tokens(self.token_limit(), self._limit_param())
        if limit is not None:
            body["max_tokens"] = limit
        try:
            return EngineRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_error(exc) from None

    def _check_logprobs(self, reports: bool, label: str) -> None:
        logprobs = getattr(self, "logprobs", None)
        if logprobs is not None and logprobs is not False and not reports:
            raise refuse(f"{label} does not report logprobs", "logprobs")

    def log_prompt(self) -> Any:
        """What the access log keeps of the request (`server.log_prompts`)."""
        return None


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    continue_final_message: bool | None = Field(
        default=None,
        description="voltgate extension (as vLLM's): continue a final assistant message instead of starting a new "
        "turn; on by default when the last message is the assistant's, `false` turns it off",
    )
    # Reasoning (docs/reasoning.md): OpenAI's effort, and the thinking budget and template variables that
    # llama.cpp's server, vLLM and SGLang take.
    reasoning_effort: Effort | None = None
    thinking_budget_tokens: ThinkingBudget | None = Field(
        default=None, description="voltgate extension: thinking tokens before the thinking is closed (0: none)"
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="extension (as vLLM's and SGLang's): variables for the model's chat template"
    )

    @model_validator(mode="before")
    @classmethod
    def _ollama_format(cls, data: Any) -> Any:
        """Ollama's `format` (Open WebUI can send it): "json" is JSON mode, a JSON schema is a json_schema
        response_format; anything else is refused by name. Never silently ignored."""
        if not isinstance(data, dict) or "format" not in data:
            return data
        data = dict(data)
        fmt = data.pop("format")
        if fmt in (None, ""):
            return data
        if data.get("response_format") is not None:
            raise ValueError("both Ollama's 'format' and 'response_format' given; send one")
        if fmt == "json":
            data["response_format"] = {"type": "json_object"}
        elif isinstance(fmt, dict):
            data["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
        else:
            raise ValueError(f'Ollama\'s format {fmt!r} is not supported: use "json", a JSON schema or response_format')
        return data

    kind: ClassVar[RequestKind] = RequestKind.CHAT

    @property
    def continues_reply(self) -> bool:
        return self.messages[-1].role == "assistant" and self.continue_final_message is not False

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def _limit_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def _sampling(self) -> dict[str, Any]:
        out = super()._sampling()
        if self.logprobs:
            out["logprobs"], out["top_logprobs"] = True, self.top_logprobs
        return out

    def check(self, caps: EngineCapabilities, label: str) -> None:
        """Refuse what the deployment (`label`) cannot honour, naming the parameter."""
        check_kind(self.kind, caps, label)
        self._check_logprobs(caps.logprobs, label)
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema" and not caps.json_schema:
            raise refuse(f"{label} cannot follow a JSON schema", "response_format")
        if fmt is not None and fmt.type == "json_object" and not caps.json_mode:
            raise refuse("json mode is not supported", "response_format")
        if self.tools and self.tool_choice != "none" and not caps.tools:
            raise refuse(f"{label} has no tool-call parser configured", "tools")

    def to_engine(self, target: EngineTarget) -> EngineRequest:
        inputs: dict[str, Any] = {
            "messages": tuple(m.to_engine() for m in self.messages),
            "continue_final_message": self.continues_reply,
            "response_format": self.response_format,
            "images": target.images,
        }
        if self.tools:
            inputs |= {"tools": tuple(self.tools), "tool_choice": self.tool_choice,
                       "parallel_tool_calls": self.parallel_tool_calls}  # fmt: skip
        inputs |= resolve(self.reasoning_ask(), target.reasoning).engine_fields(self.chat_template_kwargs)
        return self._engine(target, inputs)

    def reasoning_ask(self) -> ReasoningAsk:
        """What this request asks of a reasoning model: its effort and budget (none: the model's default)."""
        return ReasoningAsk(effort=self.reasoning_effort, budget_tokens=self.thinking_budget_tokens)

    def log_prompt(self) -> Any:
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        legacy = "legacy function calling is not supported; send the same definitions as `tools`"
        if self.functions:
            problems.append(("functions", legacy))
        if self.function_call is not None:
            problems.append(("function_call", legacy + " and `tool_choice`"))
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            problems.append(("tool_choice", "tool_choice needs `tools`"))
        if self.top_logprobs is not None and not self.logprobs:
            problems.append(("top_logprobs", "top_logprobs needs logprobs: true"))
        if self.modalities and set(self.modalities) - {"text"}:
            problems.append(("modalities", "only text output is supported"))
        if self.audio:
            problems.append(("audio", "audio output is not supported"))
        if self.prediction:
            problems.append(("prediction", "predicted outputs are not supported"))
        if self.continue_final_message and self.messages[-1].role != "assistant":
            problems.append(("continue_final_message", "the last message must be the assistant's to continue it"))
        problems += _message_problems(self.messages)
        return problems


def _message_problems(messages: list[Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        if isinstance(message, FunctionMessage):
            problems.append((f"messages[{i}].role", "role 'function' is legacy; send a 'tool' message"))
        if isinstance(message, AssistantMessage) and message.function_call is not None:
            problems.append((f"messages[{i}].function_call", "legacy function_call; send `tool_calls`"))
        content = getattr(message, "content", None)
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, ImageUrlPart) and message.role != "user":
                    problems.append((f"messages[{i}].content[{j}].type", "images are accepted in user messages only"))
                if isinstance(part, _OtherPart) and not (part.type == "refusal" and message.role == "assistant"):
                    problems.append(
                        (f"messages[{i}].content[{j}].type", f"content parts of type {part.type!r} are not supported")
                    )
    return problems


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool | None = None
    best_of: Count | None = Field(default=None, ge=1)
    logprobs: Count | None = Field(default=None, ge=0, le=5)
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            problems.append(("prompt", "exactly one prompt per request is supported"))
        if self.echo:
            problems.append(("echo", "echo is not supported"))
        if self.best_of is not None and self.best_of > 1:
            problems.append(("best_of", "best_of > 1 is not supported"))
        if self.suffix:
            problems.append(("suffix", "suffix is not supported"))
        return problems

    kind: ClassVar[RequestKind] = RequestKind.COMPLETION

    def prompt_text(self) -> str:
        return self.prompt[0] if isinstance(self.prompt, list) else self.prompt

    def _sampling(self) -> dict[str, Any]:
        out = super()._sampling()
        if self.logprobs is not None:  # the legacy integer: that many alternatives per token
            out["logprobs"], out["top_logprobs"] = True, self.logprobs
        return out

    def check(self, caps: EngineCapabilities, label: str) -> None:
        check_kind(self.kind, caps, label)
        self._check_logprobs(caps.completion_logprobs, label)

    def to_engine(self, target: EngineTarget) -> EngineRequest:
        return self._engine(target, {"prompt": self.prompt_text()})

    def log_prompt(self) -> Any:
        return self.prompt


class EmbeddingRequest(_Body):
    model: str = Field(min_length=1)
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Count | None = Field(default=None, ge=1)
    user: str | None = None
    stream: Literal[False] = False  # embeddings are never streamed: `stream: true` is a 400

    kind: ClassVar[RequestKind] = RequestKind.EMBEDDING
    units: ClassVar[int] = 1
    include_usage: ClassVar[bool] = False

    def unsupported(self) -> list[tuple[str, str]]:
        return []

    def check(self, caps: EngineCapabilities, label: str) -> None:
        check_kind(self.kind, caps, label)
        if self.dimensions is not None and not caps.dimensions:
            why = f"{label} cannot shorten its vectors: `dimensions` needs a matryoshka model (matryoshka: true)"
            raise refuse(why, "dimensions")

    def to_engine(self, target: EngineTarget) -> EngineEmbeddingRequest:
        """The worker's request, addressed to the name it knows; `target.embed_truncate` cuts over-long inputs
        instead of refusing them. What needs the tokenizer (over-long inputs, token ids outside the vocabulary)
        is the worker's 400, relayed with its `param`. `user` is not sent."""
        try:
            engine = EngineEmbeddingRequest(
                model=target.model, input=self.input, encoding_format=self.encoding_format,
                dimensions=self.dimensions, truncate=target.embed_truncate,
            )  # fmt: skip
        except ValidationError as exc:
            raise validation_error(exc) from None
        n = engine.inputs
        if n == 0:
            raise GatewayError(ErrorCode.INVALID_REQUEST, "'input' must not be an empty list", param="input")
        if n > MAX_INPUTS:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"'input' has {n} items; at most {MAX_INPUTS}", param="input")
        return engine

    def log_prompt(self) -> Any:
        return self.input


InferenceRequest = ChatCompletionRequest | CompletionRequest | EmbeddingRequest
R = TypeVar("R", ChatCompletionRequest, CompletionRequest, EmbeddingRequest)


__all__ = ["parse_request", "validation_error"]


def parse_request(raw: bytes, model_type: type[R]) -> R:
    """Decode and validate a request body, or raise a 400 `GatewayError` naming the offending parameter."""
    return parse_body(raw, model_type)
