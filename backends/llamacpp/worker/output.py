"""What the model generated, as OpenAI deltas: text, or tool calls read from the model's native syntax.

One `ChatOutput` per chat request, used by the streamed and the unary path alike. Without tools it passes
text through. With tools it runs the model family's `ToolCallStream`: text streams out at once (except
what may be the opening of a call), a call is announced once complete (first delta: index, id, type and
name; then its arguments in fragments), and output that does not parse as a call stays text: never an error.

A reply's calls end (`done`, the worker then stops generating) at the first call that repeats an earlier
one of the same reply, or at `MAX_CALLS`: small models held to a "one or more calls" grammar otherwise
loop on calls until max_tokens.
"""

from __future__ import annotations

from typing import Any

from backends.llamacpp.worker.tools import CallArguments, CallStart, StreamPiece, TextPiece, ToolCallStream, ToolFormat

Delta = dict[str, Any]

MAX_CALLS = 16
ARGUMENT_FRAGMENT_CHARS = 48


class ChatOutput:
    def __init__(self, fmt: ToolFormat | None, tool_names: tuple[str, ...], *, forced: bool = False) -> None:
        """`forced`: the output is held to a call grammar (`tool_choice` "required" or a named tool), so
        it is a call even when max_tokens cuts it short (`ToolCallStream`)."""
        self._stream = ToolCallStream(fmt, tool_names, forced=forced) if fmt is not None and tool_names else None
        self._seen: set[tuple[str, str]] = set()
        self.calls = 0
        self.done = False

    def push(self, text: str) -> list[Delta]:
        """Deltas for newly generated text."""
        if self.done:
            return []
        if self._stream is None:
            return [{"content": text}] if text else []
        return self._deltas(self._stream.push(text))

    def finish(self) -> list[Delta]:
        """Deltas for whatever was held back when generation ended."""
        if self._stream is None or self.done:
            return []
        return self._deltas(self._stream.finish())

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
