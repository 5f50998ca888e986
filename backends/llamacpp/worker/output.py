"""What the model generated, as OpenAI deltas: text, or tool calls read from the model's native syntax.

One `ChatOutput` per chat request, used by the streamed and the unary path alike. Without tools it passes
text through. With tools it runs the model family's `ToolCallStream`: text streams out at once (except
what may be the opening of a call), a call is announced once complete (first delta: index, id, type and
name; then its arguments in fragments), and output that does not parse as a call stays text: never an error.

A reply's calls end (`done`, the worker then stops generating) at the first call that repeats an earlier
one of the same reply, or at `MAX_CALLS`: small models held to a "one or more calls" grammar otherwise
loop on calls until max_tokens.

With a reasoning syntax (`reasoning.ReasoningStream`) the text is split first: thinking goes out as
`reasoning_content` deltas and only the answer reaches the tool-call parser and the stop strings (which the
worker then matches here, not in the engine, so that a stop string written while thinking does not end
the reply). `reasoning_tokens` counts the engine's text events that began inside the thinking: one per
token that produced text, as the engine releases one per token when it matches no stop strings itself.
"""

from __future__ import annotations

from typing import Any

from backends.llamacpp.worker.reasoning import Piece, ReasoningStream
from backends.llamacpp.worker.text import StopMatcher
from backends.llamacpp.worker.tools import CallArguments, CallStart, StreamPiece, TextPiece, ToolCallStream, ToolFormat

Delta = dict[str, Any]

MAX_CALLS = 16
ARGUMENT_FRAGMENT_CHARS = 48


class ChatOutput:
    def __init__(
        self,
        fmt: ToolFormat | None,
        tool_names: tuple[str, ...],
        *,
        forced: bool = False,
        reasoning: ReasoningStream | None = None,
        stops: tuple[str, ...] = (),
    ) -> None:
        """`forced`: the output is held to a call grammar (`tool_choice` "required" or a named tool), so
        it is a call even when max_tokens cuts it short (`ToolCallStream`). `reasoning`: the model's
        reasoning syntax, with `stops` the request's stop strings, matched against the answer only."""
        self._stream = ToolCallStream(fmt, tool_names, forced=forced) if fmt is not None and tool_names else None
        self._reasoning = reasoning
        self._stops = StopMatcher(stops)
        self._seen: set[tuple[str, str]] = set()
        self.calls = 0
        self.done = False
        self.matched: str | None = None  # the stop string that ended the answer (matched here)
        self.reasoning_tokens = 0

    @property
    def reasons(self) -> bool:
        """Whether the output is split by a reasoning syntax (so `reasoning_tokens` is meaningful)."""
        return self._reasoning is not None

    def push(self, text: str) -> list[Delta]:
        """Deltas for newly generated text (one engine text event)."""
        if self.done:
            return []
        if self._reasoning is None:
            return self._answer(text)
        if self._reasoning.thinking:
            self.reasoning_tokens += 1
        return self._split(self._reasoning.push(text))

    def finish(self) -> list[Delta]:
        """Deltas for whatever was held back when generation ended."""
        if self.done:
            return []
        out = self._split(self._reasoning.finish()) if self._reasoning is not None else []
        if self.done:
            return out
        held = self._stops.flush()
        out += self._answer(held, check_stops=False) if held else []
        if self._stream is None or self.done:
            return out
        return out + self._deltas(self._stream.finish())

    def _split(self, pieces: list[Piece]) -> list[Delta]:
        out: list[Delta] = []
        for kind, text in pieces:
            if self.done:
                break
            if kind == "reasoning":
                out.append({"reasoning_content": text})
            else:
                out += self._answer(text)
        return out

    def _answer(self, text: str, *, check_stops: bool = True) -> list[Delta]:
        """Answer text through the stop strings (unless already past them) and the tool-call parser."""
        if check_stops:
            result = self._stops.push(text)
            text = result.text
            if result.matched is not None:
                self.matched = result.matched
        out: list[Delta] = []
        if text:
            out = self._deltas(self._stream.push(text)) if self._stream is not None else [{"content": text}]
        if self.matched is not None and not self.done:
            if self._stream is not None:
                out += self._deltas(self._stream.finish())
            self.done = True
        return out

    def _deltas(self, pieces: list[StreamPiece]) -> list[Delta]:
        out: list[Delta] = []
        start: CallStart | None = None
        for piece in pieces:
            if self.done:
                break
            if isinstance(piece, TextPiece):
                if piece.text:
                    out.append({"content": piece.text})
            elif isinstance(piece, CallStart):
                start = piece
            elif isinstance(piece, CallArguments) and start is not None:
                out += self._call(start, piece.fragment)
                start = None
        return out

    def _call(self, start: CallStart, arguments: str) -> list[Delta]:
        key = (start.name, arguments)
        if key in self._seen or self.calls >= MAX_CALLS:
            self.done = True
            return []
        self._seen.add(key)
        index = self.calls
        self.calls += 1
        first = {"index": index, "id": start.id, "type": "function", "function": {"name": start.name, "arguments": ""}}
        deltas: list[Delta] = [{"tool_calls": [first]}]
        for i in range(0, len(arguments), ARGUMENT_FRAGMENT_CHARS):
            fragment = arguments[i : i + ARGUMENT_FRAGMENT_CHARS]
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        return deltas


def reasoning_text(deltas: list[Delta]) -> str | None:
    """A whole message's thinking (its `reasoning_content`), None when it had none."""
    text = "".join(d.get("reasoning_content", "") for d in deltas)
    return text or None


def assemble(deltas: list[Delta]) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole message from its deltas (the unary path): content text, and tool calls in OpenAI's shape."""
    text = "".join(d.get("content", "") for d in deltas)
    calls: list[dict[str, Any]] = []
    for delta in deltas:
        for part in delta.get("tool_calls", ()):
            if "id" in part:
                calls.append({"id": part["id"], "type": "function", "function": dict(part["function"])})
            else:
                calls[part["index"]]["function"]["arguments"] += part["function"]["arguments"]
    if calls:
        return (text.strip() or None), calls
    return text, calls
