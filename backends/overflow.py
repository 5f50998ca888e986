"""A prompt longer than the context, in the words clients parse: every engine's overflow error is normalised to
OpenAI's message, and the numbers are read back from it to say the same in Anthropic's words."""

from __future__ import annotations

import re

_OPENAI = re.compile(r"maximum context length is (\d+) tokens\. However, your \w+ resulted in (\d+) tokens")
_LMDEPLOY = re.compile(r"input length \((\d+)\).*context length \((\d+)\)", re.IGNORECASE)


def overflow_message(context_tokens: int, prompt_tokens: int, *, field: str = "messages") -> str:
    """OpenAI's wording (its `context_length_exceeded` message), which OpenAI clients show and match."""
    return (
        f"This model's maximum context length is {context_tokens} tokens. However, your {field} resulted in "
        f"{prompt_tokens} tokens. Please reduce the length of the {field}."
    )


def overflow_counts(message: str) -> tuple[int, int] | None:
    """(prompt tokens, context tokens) from an overflow message in OpenAI's or LMDeploy's words, else None."""
    if match := _OPENAI.search(message):
        return int(match.group(2)), int(match.group(1))
    if match := _LMDEPLOY.search(message):
        return int(match.group(1)), int(match.group(2))
    return None


def anthropic_overflow_message(prompt_tokens: int, context_tokens: int) -> str:
    """Anthropic's wording, which Claude Code matches to start its recovery (compacting the conversation)."""
    return f"prompt is too long: {prompt_tokens} tokens > {context_tokens} maximum"
