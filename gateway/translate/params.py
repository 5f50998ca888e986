"""Chat parameter names in errors, renamed to the translated API's own (`stop` → `stop_sequences`, ...).

A translated request is built as the typed chat request (`translated`: its constructors validate what the
chat path bounds), and it, the service, the workers and the cap checks name chat parameters; a client of the
Responses or Messages API must read the names it sent. A path inside `messages` names a chat message whose
index need not match the client's (system prompts and tool results are moved or split), so it is reported
as the client's whole `input` / `messages`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError

from gateway.errors import GatewayError
from gateway.protocol import ChatCompletionRequest
from gateway.protocol.parsing import supported, validation_error

_HEAD = re.compile(r"^[A-Za-z_]+")
_TOOL = re.compile(r"^tools\[(\d+)\](?:\.function)?(?:\.(\w+))?")


@dataclass(frozen=True)
class ParamNames:
    """How one translated API names the chat parameters: top-level renames and the shape of a tool's path."""

    renames: Mapping[str, str]
    tool: str  # format with `index`; a tool's field (`.name`, `.parameters`) follows
    tool_fields: Mapping[str, str]

    def of(self, param: str) -> str:
        """The translated API's name for a chat parameter path (unchanged when it is the same)."""
        tool = _TOOL.match(param)
        if tool is not None:
            index, field = tool.group(1), tool.group(2)
            name = self.tool.format(index=index)
            return f"{name}.{self.tool_fields.get(field, field)}" if field else name
        head = _HEAD.match(param)
        if head is None or head.group(0) not in self.renames:
            return param
        name = self.renames[head.group(0)]
        return name if head.group(0) == "messages" else name + param[len(head.group(0)) :]


RESPONSES = ParamNames(
    renames={
        "messages": "input",
        "max_completion_tokens": "max_output_tokens",
        "max_tokens": "max_output_tokens",
        "response_format": "text.format",
    },
    tool="tools[{index}]",
    tool_fields={},
)

MESSAGES = ParamNames(
    renames={
        "messages": "messages",
        "stop": "stop_sequences",
        "max_completion_tokens": "max_tokens",
        "response_format": "output_config.format",
        "user": "metadata.user_id",
    },
    tool="tools.{index}",
    tool_fields={"parameters": "input_schema"},
)


def renamed(error: GatewayError, names: ParamNames) -> GatewayError:
    """`error` naming the translated API's parameter, in `param` and where its message starts with it."""
    if error.param is None:
        return error
    param = names.of(error.param)
    if param == error.param:
        return error
    message, old = error.message, error.param
    if message.startswith(old) and not message[len(old) : len(old) + 1].isalnum():
        message = param + message[len(old) :]
    return GatewayError(error.code, message, param=param, retry_after_s=error.retry_after_s, status=error.status)


C = TypeVar("C", bound=ChatCompletionRequest)
T = TypeVar("T")


def translated(names: ParamNames, build: Callable[[], C]) -> C:
    """The chat request `build` constructs from typed fields (the constructors validate: bounds, limits),
    then refused for its first `unsupported()` feature; a refusal names the client's parameter. Checks that
    name the client's own paths (`messages.1.content.0.id`) run before, outside this renaming."""
    try:
        chat = build()
        # The chat request keeps unknown top-level fields aside (to refuse them by name); a translation sets
        # none, so a misspelt field name is a bug here, never a parameter silently dropped.
        assert not chat.model_extra, f"a translation set unknown chat fields: {sorted(chat.model_extra or {})}"
        return supported(chat)
    except ValidationError as exc:
        raise renamed(validation_error(exc), names) from None
    except GatewayError as exc:
        raise renamed(exc, names) from None


def located(at: tuple[int | str, ...], build: Callable[[], T]) -> T:
    """A part of the chat request built on its own (`build`), its validation errors named by where the part
    sits in the request (`("tools", 2, "function")`: `tools[2].function.name`), as if validated in place."""
    try:
        return build()
    except ValidationError as exc:
        raise validation_error(exc, at=at) from None
