"""What the tool-call parsers produce: parsed calls, the parsed output, stream pieces and call ids."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id: "call_" and 24 random alphanumerics."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ParsedCall:
    """One call the model made: the tool's name and its arguments as compact JSON text (an object)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedOutput:
    """A generation split into what the user reads and the calls the model made.

    `content` is the text outside the calls, stripped; None when nothing is left.
    """

    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)


@dataclass(frozen=True)
class TextPiece:
    """Text for the user, final: it is never retracted."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A complete call was parsed: its index among this output's calls, a new id, and the tool's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """A fragment of call `index`'s arguments; a call's fragments concatenate to its arguments JSON."""

    index: int
    fragment: str


StreamPiece = TextPiece | CallStart | CallArguments
