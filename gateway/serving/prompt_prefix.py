"""What keeps an agent session's prompt prefix cached: per-client rules that take volatile bytes out of the
prompt, and the session key a worker (or a later replica router) keeps a conversation's prefix by.

Both run on the engine request (`backends.request.EngineRequest`), after every API's translation, so chat,
Responses and Messages get the same treatment. docs/agents.md, "Keeping the prefix cached", lists each rule and
the recorded requests it was read from.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from backends.request import EngineMessage, EngineRequest
from gateway.config import PromptCacheSettings

BILLING_HEADER = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)
"""Claude Code's attribution line (`x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;`,
sometimes with `cch=<hash>;`): its first system block, whose suffix changes between requests."""

SESSION_HEADERS = ("session_id", "conversation_id")
"""Codex CLI's per-session headers (codex-rs `client.rs`), in the order they are read."""


class Rule(StrEnum):
    """A neutralising rule; the value is its `prompt_cache` config switch and its metric label."""

    CLAUDE_CODE_BILLING_HEADER = "claude_code_billing_header"


def neutralise(request: EngineRequest, settings: PromptCacheSettings) -> tuple[EngineRequest, tuple[Rule, ...]]:
    """The request with each enabled rule applied to its system messages, and the rules that changed something.

    Claude Code's billing line is removed wherever a system message holds it at the start of a line (the
    Messages translation joins its `system` blocks with newlines, so the line is the first of the first system
    message); nothing else of the message changes, and a message left empty is dropped. Its content carries no
    instruction for the model (Anthropic's analytics), so removing it changes no answer.
    """
    if request.messages is None or not settings.claude_code_billing_header:
        return request, ()
    changed = False
    messages: list[EngineMessage] = []
    for message in request.messages:
        if message.role == "system" and message.content and "x-anthropic-billing-header:" in message.content:
            content = BILLING_HEADER.sub("", message.content)
            if content != message.content:
                changed = True
                if not content.strip() and len(request.messages) > 1:
                    continue
                message = message.model_copy(update={"content": content})
        messages.append(message)
    if not changed:
        return request, ()
    return request.model_copy(update={"messages": tuple(messages)}), (Rule.CLAUDE_CODE_BILLING_HEADER,)


@dataclass(frozen=True)
class SessionHints:
    """What a client sent that names its session, one field per source (all optional)."""

    prompt_cache_key: str | None = None  # OpenAI chat and Responses
    anthropic_user_id: str | None = None  # Messages `metadata.user_id` (Claude Code's holds its session id)
    previous_response_id: str | None = None  # Responses
    user: str | None = None  # OpenAI chat and Responses `user`


def session_key(hints: SessionHints, headers: Mapping[str, str], chains: ResponseChains | None = None) -> str | None:
    """The session key for a request, or None when it names no session.

    The first source present wins: `prompt_cache_key` (the client's own cache key), Codex's `session_id` /
    `conversation_id` headers, Claude Code's `metadata.user_id`, the session of the Response named by
    `previous_response_id` (its chain's key, so every turn of a chain has the first turn's key), OpenAI `user`.
    The key is a hash of the source and its value (`hash_key`): a user id never reaches a worker or a log.
    """
    if hints.prompt_cache_key:
        return hash_key("prompt_cache_key", hints.prompt_cache_key)
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return hash_key(name, value)
    if hints.anthropic_user_id:
        return hash_key("metadata.user_id", hints.anthropic_user_id)
    if hints.previous_response_id:
        known = chains.get(hints.previous_response_id) if chains is not None else None
        return known or hash_key("previous_response_id", hints.previous_response_id)
    if hints.user:
        return hash_key("user", hints.user)
    return None


def hash_key(source: str, value: str) -> str:
    """32 hex digits of SHA-256 over the source's name and the value: stable across restarts and replicas."""
    return hashlib.sha256(f"{source}\0{value}".encode()).hexdigest()[:32]


class ResponseChains:
    """The session key of recent Responses (response id → key), so a `previous_response_id` turn keeps its
    chain's key. Bounded: the least recently used ids go first (a forgotten id gets a key of its own)."""

    def __init__(self, max_entries: int = 65536) -> None:
        self._keys: OrderedDict[str, str] = OrderedDict()
        self._max = max_entries

    def get(self, response_id: str) -> str | None:
        key = self._keys.get(response_id)
        if key is not None:
            self._keys.move_to_end(response_id)
        return key

    def remember(self, response_id: str, key: str) -> None:
        self._keys[response_id] = key
        self._keys.move_to_end(response_id)
        while len(self._keys) > self._max:
            self._keys.popitem(last=False)
