"""The typed requests between the gateway and its workers, one per kind: `EngineRequest` (chat and text
completions), `EngineEmbeddingRequest`, `EngineRerankRequest` (`AnyEngineRequest` is any of them).

The gateway validates a client's body against OpenAI's wire types (`gateway.protocol`), maps what belongs
to it (e.g. the `developer` role to `system`, legacy `functions` to `tools`, content parts to text), and
builds an `EngineRequest`. Every worker validates the body it receives with this same model, so the bounds
on both sides are one set of `Annotated` types defined here and imported by the gateway's protocol.

The JSON form uses OpenAI's field names, so a remote OpenAI endpoint or LMDeploy's api_server accepts it
with little or no translation.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator


class RequestKind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    RERANK = "rerank"


ENGINE_PATHS = {RequestKind.CHAT: "/v1/chat/completions", RequestKind.COMPLETION: "/v1/completions",
                RequestKind.EMBEDDING: "/v1/embeddings", RequestKind.RERANK: "/v1/rerank"}  # fmt: skip
"""Where each kind of request goes on a worker (every engine here speaks OpenAI's paths)."""


# -- bounds shared with the gateway's wire types ----------------------------------------------------------
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(ge=0, le=1)]  # 0: OpenAI's minimum, keeps only the most likely token
# A count is a JSON integer: `true` is not 1 and `2.0` is not 2 (`Strict`: pydantic's lax mode takes both).
Count = Annotated[int, Strict()]
TopK = Annotated[int, Strict(), Field(ge=0)]
MinP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
RepetitionPenalty = Annotated[float, Field(gt=0, le=10)]
MaxTokens = Annotated[int, Strict(), Field(ge=1, le=2**31 - 1)]
TopLogprobs = Annotated[int, Strict(), Field(ge=0, le=20)]
LogitBias = Annotated[float, Field(ge=-100, le=100)]
Choices = Annotated[int, Strict(), Field(ge=1, le=16)]
Seed = Annotated[int, Strict(), Field(ge=-(2**63), le=2**63 - 1)]  # int64, as OpenAI's API and the engines take it
TokenId = Annotated[int, Strict(), Field(ge=0)]  # a token id: an integer, never a bool or a float
StopString = Annotated[str, Field(min_length=1)]

STOP_LIMIT = 16
"""Stop strings per request. OpenAI allows 4; chat frontends send more, and both engines handle 16."""

MAX_BUDGET_MESSAGE_CHARS = 1000
"""A thinking budget's message: a sentence or two, forced token by token into every cut reply."""

ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionDefinition(_Frozen):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Frozen):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(_Frozen):
    name: ToolName


class NamedToolChoice(_Frozen):
    type: Literal["function"] = "function"
    function: FunctionName


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


def missing_tool(name: str | None, names: set[str] | frozenset[str]) -> str | None:
    """The one check that a named `tool_choice` names an offered tool: the refusal's message, or None.
    Every API (chat, Responses, Messages) and the workers ask it, each naming its own parameter path."""
    return None if name is not None and name in names else f"tool_choice names {name!r}, which is not in tools"


class FunctionCall(_Frozen):
    name: str
    arguments: str = Field(description="JSON text, as OpenAI sends it")

    def arguments_value(self) -> Any:
        """The arguments parsed (chat templates iterate over them); the raw text if it is not JSON."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


class ToolCall(_Frozen):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


IMAGE_MARKER = "<__media__>"
"""Where an image was in a message's text (llama.cpp's multimodal default marker, as llama-server uses it):
the engine request's `images` fill the markers of its messages in order."""

ImageMediaType = Literal["image/png", "image/jpeg", "image/webp", "image/gif"]


class EngineImage(_Frozen):
    """An image part, already decoded and checked by the gateway (`gateway/serving/images.py`): its original bytes,
    base64 on the wire, and their SHA-256."""

    media_type: ImageMediaType
    data: str = Field(min_length=1, description="the encoded image, standard base64")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("data")
    @classmethod
    def _base64(cls, data: str) -> str:
        try:
            base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"images: data is not base64 ({exc})") from exc
        return data

    @classmethod
    def of(cls, media_type: ImageMediaType, raw: bytes, digest: str) -> EngineImage:
        return cls(media_type=media_type, data=base64.b64encode(raw).decode("ascii"), digest=digest)

    def raw(self) -> bytes:
        return base64.b64decode(self.data)

    def data_uri(self) -> str:
        return f"data:{self.media_type};base64,{self.data}"


class EngineMessage(_Frozen):
    """A chat message with its content flattened to text; `tool` messages carry their call's id.

    An image part leaves an `IMAGE_MARKER` in the text where it was (the image is in `EngineRequest.images`).
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = Field(default=None, description="an assistant turn's thinking")
    reasoning: str | None = Field(default=None, description="the same, under vLLM's 2026 name")


class JsonSchemaFormat(_Frozen):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None
    description: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)


class ResponseFormat(_Frozen):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format.json_schema is required when type is 'json_schema'")
        return self


class StreamOptions(_Frozen):
    """`include_usage`: a last chunk with the stream's usage (OpenAI's). `include_prompt_usage` (voltgate's,
    a narrower vLLM `continuous_usage_stats`): the first chunk also carries `usage`, with the prompt's tokens
    (and the cached ones) and 0 completion tokens, sent once the prompt has a slot; the Messages API reads
    it for `message_start`. An engine that does not know it sends its first chunk without usage."""

    include_usage: bool = False
    include_prompt_usage: bool | None = None  # None: left out of the wire, which other engines may refuse


class EngineRequest(_Frozen):
    """What a worker accepts on /v1/chat/completions (`messages`) or /v1/completions (`prompt`)."""

    model: str = Field(min_length=1)
    messages: tuple[EngineMessage, ...] | None = None
    prompt: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    stop: tuple[StopString, ...] = Field(default=(), max_length=STOP_LIMIT)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool = False
    n: Choices = 1
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    logit_bias: dict[int, LogitBias] | None = None
    response_format: ResponseFormat | None = None
    tools: tuple[Tool, ...] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    continue_final_message: bool = Field(
        default=False, description="the last (assistant) message is continued, not followed by a new turn"
    )
    images: tuple[EngineImage, ...] = Field(
        default=(), description="the messages' images, in the order of their IMAGE_MARKERs in the text"
    )
    session_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="the client's session, hashed by the gateway (docs/agents.md, 'Session key'): requests with "
        "the same key continue one conversation, so a worker may keep its prefix where the next turn finds it",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="extra variables for the chat template's render, e.g. enable_thinking"
    )
    thinking_budget_tokens: int | None = Field(
        default=None,
        ge=0,
        description="tokens the model may think before the worker closes the thinking; 0: none; null: no limit",
    )
    thinking_budget_message: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_BUDGET_MESSAGE_CHARS,
        description="text the worker writes into the thinking before it closes it at the budget (the model's "
        "own `reasoning.budget_message`), so the model wraps up rather than going on with its thought",
    )

    @model_validator(mode="after")
    def _one_input(self) -> EngineRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("exactly one of 'messages' and 'prompt' is required")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must not be empty")
        if self.images:
            markers = sum((m.content or "").count(IMAGE_MARKER) for m in self.messages or ())
            if markers != len(self.images):
                raise ValueError(f"the messages hold {markers} image markers for {len(self.images)} images")
        return self

    @field_validator("tool_choice")
    @classmethod
    def _choice_names_a_tool(cls, choice: ToolChoice | None, info: ValidationInfo) -> ToolChoice | None:
        tools = info.data.get("tools") or ()
        problem = (
            missing_tool(choice.function.name, {t.function.name for t in tools})
            if isinstance(choice, NamedToolChoice)
            else None
        )
        if problem is not None:
            raise ValueError(problem)
        return choice

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def kind(self) -> RequestKind:
        return RequestKind.CHAT if self.messages is not None else RequestKind.COMPLETION

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def include_prompt_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_prompt_usage)

    def asking_prompt_usage(self) -> EngineRequest:
        """This streamed request, its first chunk asked to carry the prompt's usage (see `StreamOptions`)."""
        if not self.stream:
            return self
        options = StreamOptions(include_usage=self.include_usage, include_prompt_usage=True)
        return self.model_copy(update={"stream_options": options})

    def without_prompt_usage(self) -> EngineRequest:
        """This request without `include_prompt_usage`, for an engine that does not know it."""
        if not self.include_prompt_usage:
            return self
        return self.model_copy(update={"stream_options": StreamOptions(include_usage=self.include_usage)})

    @property
    def active_tools(self) -> tuple[Tool, ...]:
        """The tools the model may call: none when `tool_choice` is "none", only the named one when named."""
        tools = self.tools or ()
        choice = self.tool_choice
        if choice == "none":
            return ()
        if isinstance(choice, NamedToolChoice):
            return tuple(t for t in tools if t.function.name == choice.function.name)
        return tools

    def wire(self) -> dict[str, Any]:
        """The JSON body sent to a worker: OpenAI names; top-level fields at their default left out."""
        body = self.model_dump(mode="json", exclude_none=True, by_alias=True)
        defaults = _top_level_defaults(type(self))
        for name in [name for name in body if name in defaults]:
            if getattr(self, name) == defaults[name]:
                del body[name]
        return body


@functools.cache
def _top_level_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's default but `model`'s, made once per class (compared with, never handed out): a worker's
    body is built on the way to the first token."""
    fields = model.model_fields.items()
    return {name: field.get_default(call_default_factory=True) for name, field in fields if name != "model"}


# -- embeddings and reranking (the embedding worker: backends/llamacpp/worker/embed_server.py) --------------------


MAX_INPUTS = 2048
"""Inputs per embeddings request and documents per rerank request: OpenAI's limit, the gateway's and the
embedding worker's (one constant for all three)."""


class EngineEmbeddingRequest(_Frozen):
    """What an embedding worker accepts on /v1/embeddings: OpenAI's body, plus `normalize` and `truncate`.

    `input` is one text, many texts, one token array or many token arrays. `dimensions` keeps the first
    that many components (then re-normalises); only a model served as matryoshka honours it. `truncate`
    cuts an over-long input to the context instead of refusing it.
    """

    model: str = Field(min_length=1)
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    normalize: bool = True
    truncate: bool = False

    kind: ClassVar[RequestKind] = RequestKind.EMBEDDING

    @property
    def inputs(self) -> int:
        """How many vectors the request asks for: one text or one token array is one, a list is one each."""
        raw = self.input
        if isinstance(raw, str) or (raw and all(isinstance(item, int) for item in raw)):
            return 1
        return len(raw)

    def wire(self) -> dict[str, Any]:
        """The JSON body sent to a worker (defaults left out)."""
        return self.model_dump(mode="json", exclude_defaults=True) | {"model": self.model, "input": self.input}


class EngineRerankRequest(_Frozen):
    """What a rerank worker accepts on /v1/rerank (llama.cpp's, Jina's and Cohere's shape).

    `top_n` keeps the best that many results (all when absent); `return_documents` echoes each document.
    """

    model: str = Field(min_length=1)
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False

    kind: ClassVar[RequestKind] = RequestKind.RERANK

    def wire(self) -> dict[str, Any]:
        """The JSON body sent to a worker (defaults left out)."""
        return self.model_dump(mode="json", exclude_defaults=True) | {"model": self.model}


AnyEngineRequest = EngineRequest | EngineEmbeddingRequest | EngineRerankRequest
"""Any request a worker accepts; its `kind` says which path it goes to (`ENGINE_PATHS`)."""
