"""Chat parameter names in errors, renamed to the translated API's own (`stop` → `stop_sequences`, ...).

A translated request is validated again as a chat request, and the service, the workers and the cap
checks name chat parameters; a client of the Responses or Messages API must read the names it sent. A
path inside `messages` names a chat message whose index need not match the client's (system prompts and
tool results are moved or split), so it is reported as the client's whole `input` / `messages`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.errors import GatewayError
from gateway.protocol import ChatCompletionRequest
from gateway.protocol.parsing import validate_body

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


def chat_request(body: dict[str, Any], names: ParamNames) -> ChatCompletionRequest:
    """A translated request as the gateway's chat request (validated from memory, never re-encoded as JSON);
    a refusal names the client's parameter."""
    return translated_request(body, names, ChatCompletionRequest)


def translated_request(body: dict[str, Any], names: ParamNames, request_type: type[C]) -> C:
    """`chat_request` as a subclass of the chat request that shapes its own engine request."""
    try:
        return validate_body(body, request_type)
    except GatewayError as exc:
        raise renamed(exc, names) from None
