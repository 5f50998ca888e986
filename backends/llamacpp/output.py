"""What the model generated, as OpenAI deltas: text, or tool calls read from the model's native syntax.

One `ChatOutput` per chat request. Without tools it passes text through. With tools it runs the model
family's `ToolCallStream`: text streams out at once (except what may be the opening of a call), a call
is announced once complete (first delta: index, id, type, name; then its argument fragments), and output
that does not parse as a call stays text: never an error.
"""

from __future__ import annotations

from typing import Any

from backends.llamacpp.tools import CallArguments, CallStart, TextPiece, ToolCallStream, ToolFormat, new_call_id

Delta = dict[str, Any]


class ChatOutput:
    def __init__(self, fmt: ToolFormat | None, tool_names: tuple[str, ...]) -> None:
        self._fmt = fmt if tool_names else None
        self._names = tool_names
        self._stream = ToolCallStream(fmt, tool_names) if fmt is not None and tool_names else None
        self.calls = 0

    @property
    def tools_active(self) -> bool:
        return self._stream is not None

    def push(self, text: str) -> list[Delta]:
        """Deltas for newly generated text (streaming)."""
        if self._stream is None:
            return [{"content": text}] if text else []
        return self._deltas(self._stream.push(text))

    def finish(self) -> list[Delta]:
        """Deltas for whatever was held back when generation ended."""
        if self._stream is None:
            return []
        return self._deltas(self._stream.finish())

    def _deltas(self, pieces: list[Any]) -> list[Delta]:
        out: list[Delta] = []
        for piece in pieces:
            if isinstance(piece, TextPiece):
                if piece.text:
                    out.append({"content": piece.text})
            elif isinstance(piece, CallStart):
                self.calls += 1
                function = {"name": piece.name, "arguments": ""}
                out.append({"tool_calls": [{"index": piece.index, "id": piece.id, "type": "function",
                                            "function": function}]})  # fmt: skip
            elif isinstance(piece, CallArguments):
                out.append({"tool_calls": [{"index": piece.index, "function": {"arguments": piece.fragment}}]})
        return out

    def complete(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The whole answer (non-streaming): its text content and its tool calls in OpenAI's shape."""
        if self._fmt is None:
            return text, []
        parsed = self._fmt.parse(text, self._names)
        calls = [
            {"id": new_call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.calls
        ]
        if not calls:
            return text, []
        self.calls = len(calls)
        return parsed.content, calls
