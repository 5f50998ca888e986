"""`ToolCallStream`: tool calls and text parsed incrementally from generated text, never retracted."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from backends.llamacpp.worker.tools.calls import CallArguments, CallStart, StreamPiece, TextPiece, new_call_id
from backends.llamacpp.worker.tools.syntax import Scan

if TYPE_CHECKING:
    from backends.llamacpp.worker.tools.formats import ToolFormat


class ToolCallStream:
    """Splits streamed generated text into user text and complete tool calls, one family's syntax.

    Feed every decoded text fragment to `push` and call `finish` once at the end; each returns pieces to
    send now. Text streams out at once, except a suffix that could still become a call's opener (held back
    like `StopMatcher` holds a stop string) and whitespace, which is sent only once more text follows it:
    the pieces' text joined is exactly `ParsedOutput.content` of the same output (stripped; "" for None).

    Once an opener appears, text is buffered until the call block is complete, then it comes out as a
    `CallStart` (a fresh id) followed by `CallArguments` whose fragments join to the arguments JSON. A block
    that turns out malformed, names an unknown tool, or is still open at `finish`, is sent as plain text,
    and so is everything after it: unlike the one-shot parse, calls already sent stay sent. With `forced`
    (the output is held to a call grammar) a block still open at `finish` is generation cut short by
    max_tokens: it is sent as a call with its arguments so far (`CallSyntax.truncated_call`), or as nothing
    when it stopped before a tool was known (the grammar's syntax is never the user's text). Not
    thread-safe: one stream per generated sequence.

    An open block is rescanned only when it may have just closed (see `_Closings`) or is still short, so
    streaming a long call (a file written through a tool) costs time linear in its length.
    """

    SHORT_BLOCK = 48
    """Below this many characters an open block is rescanned on every push, so that a block that is no call
    ("<tool_call> is a tag") is given back as text promptly."""

    def __init__(self, fmt: ToolFormat, tool_names: Iterable[str], *, forced: bool = False) -> None:
        self._syntax = fmt.syntax
        self._forced = forced  # held to a call grammar: a block cut short at the end is still a call
        self._names = frozenset(tool_names)
        self._buffer = ""
        self._in_call = False
        self._text_only = False
        self._sent_text = False
        self._held_space = ""
        self._calls = 0
        self._closings = _Closings()
        self._may_be_complete = False

    def push(self, text: str) -> list[StreamPiece]:
        """Pieces that `text` (appended to what came before) makes final."""
        self._buffer += text
        if self._in_call:
            self._may_be_complete |= self._closings.feed(text)
        return self._drain(final=False)

    def finish(self) -> list[StreamPiece]:
        """Everything still held: the end of the output decides open calls (they become text)."""
        return self._drain(final=True)

    @property
    def calls(self) -> int:
        """How many calls have been sent so far."""
        return self._calls

    def _drain(self, *, final: bool) -> list[StreamPiece]:
        pieces: list[StreamPiece] = []
        while self._buffer:
            if self._text_only:
                pieces += self._text(self._take(len(self._buffer)))
            elif self._in_call:
                if not self._advance_call(pieces, final=final):
                    break
            else:
                at_start = not self._sent_text and self._calls == 0
                start = self._syntax.find_opener(self._buffer, 0, at_start=at_start)
                if start >= 0:
                    pieces += self._text(self._take(start))
                    self._in_call = True
                    self._closings = _Closings()
                    self._may_be_complete = self._closings.feed(self._buffer)
                    continue
                keep = self._syntax.partial_opener(self._buffer, at_start=at_start)
                if final:  # the end: a held prefix of an opener is text, or (forced) a call's syntax cut short
                    self._buffer, keep = (self._buffer[: len(self._buffer) - keep] if self._forced else self._buffer), 0
                pieces += self._text(self._take(len(self._buffer) - keep))
                break
        return pieces

    def _advance_call(self, pieces: list[StreamPiece], *, final: bool) -> bool:
        """Scan the open call block; False when it needs more text."""
        if not (final or self._may_be_complete or len(self._buffer) < self.SHORT_BLOCK):
            return False
        scan = self._syntax.scan(self._buffer, self._names, final=final)
        if scan.status == "more":
            self._may_be_complete = False
            return False
        calls = scan.calls
        if scan.status == "fail" and final and self._forced:  # cut by max_tokens: a call, never its syntax
            truncated = self._syntax.truncated_call(self._buffer, self._names)
            calls = (truncated,) if truncated is not None else ()
            scan = Scan("done", calls, len(self._buffer))
        elif scan.status == "fail":
            self._text_only, self._in_call = True, False
            return True
        self._take(scan.end)
        self._in_call = False
        for call in calls:
            pieces.append(CallStart(self._calls, new_call_id(), call.name))
            pieces.append(CallArguments(self._calls, call.arguments))
            self._calls += 1
        return True

    def _take(self, n: int) -> str:
        taken, self._buffer = self._buffer[:n], self._buffer[n:]
        return taken

    def _text(self, text: str) -> list[StreamPiece]:
        """User text, with whitespace held so that the whole reads as the stripped content."""
        body = text.rstrip()
        if not body:
            self._held_space += text
            return []
        lead = self._held_space
        if not self._sent_text:
            lead, body = "", body.lstrip()
        self._held_space = text[len(text.rstrip()) :]
        self._sent_text = True
        return [TextPiece(lead + body)]


class _Closings:
    """Watches an open call block's text for the points where it may have become complete: a closing
    character (`}`, `]`, `>`, `)`) outside JSON strings with no bracket left open. Every syntax's block
    ends at one (a JSON object or list, a closing tag, a `)`), and scan answers depend only on the text
    read so far, so scanning only at these points (and at the end) gives the same answers."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> bool:
        """Whether `text`, appended to the block, holds such a point."""
        found = False
        for char in text:
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                found = found or self._depth <= 0
            elif char in ">)":
                found = found or self._depth <= 0
        return found
