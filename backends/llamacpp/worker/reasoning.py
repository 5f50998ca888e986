"""Thinking kept apart from the answer: the reasoning syntax of a chat template, parsed while it streams.

Like llama.cpp's server (common/chat.cpp, `reasoning_format`) and vLLM's reasoning parsers, the family is
chosen once from the GGUF's chat template:

* "deepseek": `<think>...</think>` then the answer (Qwen3 / 3.5 / 3.6, DeepSeek-R1 and its distills,
  GLM-4.5+). A template may pre-fill `<think>` in the generation prompt (R1 distills, Qwen3.5): the output
  then starts inside the thinking (`starts_thinking`, read from the rendered prompt).
* "harmony": gpt-oss's channels, `<|channel|>analysis<|message|>...<|end|>` is thinking and
  `<|start|>assistant<|channel|>final<|message|>...` the answer.
* "none": no reasoning syntax; the output is all answer.

`ReasoningStream` splits text fragments (as decoded, tags possibly split across tokens) into reasoning and
answer pieces, holding back only what may still be the start of a tag. A thinking block still open when
generation ends is thinking, not answer. A harmony message addressed to a function (`to=functions.NAME`, a
tool call) goes to the answer whole, header and end marker included, for the tool parser
(`tools/harmony.py`); a commentary message to no one (a preamble) is answer text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Literal

ReasoningFormat = Literal["none", "deepseek", "harmony"]
Start = Literal["open", "thinking", "answer"]
"""Where a reply's output begins: free to open a thinking block, inside one (the prompt opened it), or in
the answer (the prompt closed or skipped the thinking)."""
PieceKind = Literal["reasoning", "content"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
HARMONY_CHANNEL = "<|channel|>"
HARMONY_MESSAGE = "<|message|>"
HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
HARMONY_START = "<|start|>"
HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
HARMONY_HEADER_LIMIT = 256
"""A harmony header longer than this without `<|message|>` is not one: the text is shown as answer."""
_ANSWER_HEADERS = ("to=functions.", HARMONY_CHANNEL + "final", HARMONY_CHANNEL + "commentary")
HARMONY_CALL_OPEN = "<|end|><|start|>assistant"
"""What closes harmony's analysis where a tool may be called next: a new assistant message, whose header
the model (or a call grammar) then writes."""
_HARMONY_HEADER = re.compile(
    r"(?:<\|start\|>)?\s*(?:assistant)?(?:\s*to=(?P<role>[^\s<]+))?\s*<\|channel\|>(?P<channel>[A-Za-z]+)"
    r"(?: to=(?P<to>[^\s<]+))?(?: ?(?:<\|constrain\|>)?[A-Za-z0-9_-]+)?\s*"
)


def recipient(header: str) -> str | None:
    """The function a harmony header (the text before `<|message|>`) addresses: NAME of a commentary or
    analysis message `to=functions.NAME` (in the role part or the channel part); else None."""
    found = _HARMONY_HEADER.fullmatch(header.strip())
    if found is None or found.group("channel") not in ("commentary", "analysis"):
        return None
    target = found.group("role") or found.group("to") or ""
    return target.removeprefix("functions.") if target.startswith("functions.") else None


@dataclass(frozen=True)
class ReasoningSyntax:
    """A template family's reasoning syntax.

    `switch`: the template variable that turns thinking off (`enable_thinking`), when the template reads
    one; `skip`: text that, appended to the generation prompt, ends the thinking before it starts (when the
    prompt already opened it, only the closing part is appended: `closing`).
    `preserved_tokens`: markers that are special tokens in the family's vocabulary and must be shown.
    """

    format: ReasoningFormat
    switch: str | None = None

    @property
    def enabled(self) -> bool:
        return self.format != "none"

    @property
    def closing(self) -> str:
        """What closes an open thinking block so the answer follows."""
        if self.format == "harmony":
            return "<|end|><|start|>assistant<|channel|>final<|message|>"
        return THINK_CLOSE + "\n\n"

    def skip(self, start: Start) -> str:
        """Text appended to the generation prompt for no thinking at all ("" when there is none to skip)."""
        if start == "answer":
            return ""
        if self.format == "harmony":
            return "<|channel|>final<|message|>" if start == "open" else self.closing
        return self.closing if start == "thinking" else THINK_OPEN + "\n\n" + self.closing

    @property
    def preserved_tokens(self) -> tuple[str, ...]:
        if self.format == "harmony":
            return (HARMONY_CHANNEL, HARMONY_MESSAGE, HARMONY_START, *HARMONY_ENDS)
        if self.format == "deepseek":
            return (THINK_OPEN, THINK_CLOSE)
        return ()

    def start(self, prompt: str) -> Start:
        """Where the output of the rendered generation prompt `prompt` begins."""
        tail = prompt.rstrip()
        if self.format == "deepseek" and tail.endswith(THINK_OPEN):
            return "thinking"
        if self.format == "deepseek" and tail.endswith(THINK_CLOSE):
            return "answer"  # the template skipped the thinking (Qwen3's enable_thinking=false)
        if self.format == "harmony" and tail.endswith(HARMONY_MESSAGE):
            return "thinking" if tail.endswith(HARMONY_ANALYSIS) else "answer"
        return "open" if self.enabled else "answer"


NO_REASONING = ReasoningSyntax("none")


def select_reasoning(template: str) -> ReasoningSyntax:
    """The reasoning syntax a chat template's text uses (llama.cpp's detection: by its markers)."""
    if HARMONY_CHANNEL in template and HARMONY_MESSAGE in template:
        return ReasoningSyntax("harmony")
    if THINK_OPEN in template and THINK_CLOSE in template:
        return ReasoningSyntax("deepseek", "enable_thinking" if "enable_thinking" in template else None)
    return NO_REASONING


@dataclass(frozen=True)
class ThinkingBudget:
    """A request's thinking budget (`thinking_budget_tokens` N > 0), for the engine thread.

    Once `limit` tokens were generated inside the thinking, the worker appends `closing` (the family's
    closing text, tokenized) as forced tokens and the answer follows, as llama-server's `--reasoning-budget`
    does. `tracker()` makes one sequence's counter.
    """

    limit: int
    closing: tuple[int, ...]
    syntax: ReasoningSyntax
    start: Start

    def tracker(self) -> BudgetTracker:
        return BudgetTracker(self)


class BudgetTracker:
    """One sequence's thinking-token count (engine thread; plain Python, a few string operations a token).

    A model cut off by its budget does not know it was: it may go on with its thought in the answer and
    close it with its own `</think>`, and a small one then copies that tag again and again (llama.cpp issue
    28182, seen with Qwen3.6; SmolLM2 in our agent tests). After a forced deepseek closing, `shown` hides
    every reasoning tag the model writes in the rest of the reply, so an answer never shows a raw tag; the
    text around them stays the answer's (it was streamed as such). Harmony needs none of this: its stream
    reads every header.
    """

    def __init__(self, budget: ThinkingBudget) -> None:
        self._budget = budget
        self._stream = ReasoningStream(budget.syntax, budget.start)
        self._spent = 0
        self._phase: Literal["counting", "closing", "closed", "hiding", "done"] = "counting"
        self._closing_left = 0  # forced closing tokens still to pass through `after`
        self._held = ""  # what may still be the start of a hidden tag

    def after(self, text: str) -> tuple[int, ...]:
        """The tokens to force next, given the text of the token just generated: the closing once the
        budget is spent inside a still open thinking block, else nothing."""
        if self._phase == "closing":
            self._closing_left -= 1
            self._phase = "closing" if self._closing_left else "closed"
        elif self._phase == "closed":  # the model's first token after the forced closing
            self._phase = "hiding" if self._budget.syntax.format == "deepseek" else "done"
        if self._phase != "counting":
            return ()
        if self._stream.thinking:
            self._spent += 1
        self._stream.push(text)
        if self._spent >= self._budget.limit and self._stream.thinking:
            self._phase, self._closing_left = "closing", len(self._budget.closing)
            return self._budget.closing
        return ()

    def shown(self, text: str, *, final: bool = False) -> tuple[str, int]:
        """The part of `text` (the tokens' text after `after`) to show, and how many characters were hidden;
        `final`: nothing follows, so text held as a possible tag goes out."""
        if self._phase != "hiding":
            return text, 0
        tags = (THINK_OPEN, THINK_CLOSE)
        buffer, out, hidden = self._held + text, [], 0
        at, tag = _first(buffer, tags)
        while tag is not None:
            out.append(buffer[:at])
            buffer, hidden = buffer[at + len(tag) :], hidden + len(tag)
            at, tag = _first(buffer, tags)
        keep = 0 if final else max(_partial_suffix(buffer, t) for t in tags)
        out.append(buffer[: len(buffer) - keep])
        self._held = buffer[len(buffer) - keep :]
        return "".join(out), hidden


def after_thinking(
    grammar: str | None,
    triggers: tuple[str, ...],
    syntax: ReasoningSyntax,
    start: Start,
    *,
    final_message: bool = False,
) -> tuple[str | None, tuple[str, ...]]:
    """A grammar (and its lazy triggers) that lets the thinking through first.

    deepseek: a lazy grammar's triggers only count after `</think>` (where the output opened or may open
    a `<think>` block); with the output inside the thinking (`start` "thinking") a grammar that holds the
    whole reply (a forced call, JSON output) becomes lazy, starting at `</think>` (as llama.cpp does).
    harmony: a whole-reply grammar, which holds the message after `<|start|>assistant` (a call; with
    `final_message`, the final channel's text, so JSON output), may first write an analysis message
    (`start` "open") or must close the one the prompt opened ("thinking"). Lazy harmony triggers are
    anchored at a message header already (`tools/harmony.py`). Otherwise unchanged.
    """
    if grammar is None or start == "answer" or not syntax.enabled:
        return grammar, triggers
    if syntax.format == "harmony":
        return (grammar if triggers else _after_analysis(grammar, start, final_message=final_message)), triggers
    if triggers:
        return grammar, _after_think_close(triggers, start)
    if start != "thinking":
        return grammar, triggers
    root = f'root ::= "{THINK_CLOSE}" [ \\t\\n]* answer-root'
    # Only whitespace after `</think>` in the token that closes it: llama.cpp would abort on more (see
    # `tools.formats.may_follow`); a token that runs on into the answer leaves the reply unheld.
    return f"{_renamed_root(grammar)}\n{root}\n", (r"^[\s\S]*?(" + THINK_CLOSE + r")[ \t\n]*$",)


def _after_think_close(triggers: tuple[str, ...], start: Start) -> tuple[str, ...]:
    """Trigger patterns (full matches over the output so far, `^...$`) that fire only outside a `<think>`
    block: after its `</think>` when the output began inside one or opened one first, anywhere otherwise
    (the answer began without thinking, as `ReasoningStream` reads it)."""
    closed = r"[\s\S]*?" + THINK_CLOSE
    prefixes = (closed,) if start == "thinking" else (r"\s*" + THINK_OPEN + closed, r"(?!\s*" + THINK_OPEN + ")")
    return tuple("^" + prefix + trigger.removeprefix("^") for trigger in triggers for prefix in prefixes)


_HARMONY_NOT_END = 'h-not-end ::= [^<] | "<" [^|] | "<|" [^e] | "<|e" [^n] | "<|en" [^d] | "<|end" [^|] | "<|end|" [^>]'


def _after_analysis(grammar: str, start: Start, *, final_message: bool) -> str:
    """A harmony whole-reply grammar behind the analysis message (optional where the output may open
    one, closed first where the prompt opened it)."""
    body = _renamed_root(grammar)
    answer = "answer-root"
    if final_message:
        body += '\nh-final ::= "<|channel|>final" ( " "? "<|constrain|>"? "json" )? "<|message|>" answer-root'
        answer = "h-final"
    analysis = f'h-not-end* "{HARMONY_CALL_OPEN}"'
    if start == "open":
        analysis = f'( "{HARMONY_ANALYSIS}" {analysis} )?'
    return f"{body}\n{_HARMONY_NOT_END}\nroot ::= {analysis} {answer}\n"


def _renamed_root(grammar: str) -> str:
    """The grammar with its `root` rule named `answer-root`, for a new root to wrap."""
    return re.sub(r"^root(\s*)::=", r"answer-root\1::=", grammar, flags=re.MULTILINE).rstrip("\n")


class _State(Enum):
    START = "start"  # before any output: may open a thinking block (deepseek) or a header (harmony)
    THINKING = "thinking"
    ANSWER = "answer"
    AFTER_CLOSE = "after_close"  # just closed: whitespace before the answer is dropped
    HEADER = "header"  # harmony: reading `<|channel|>NAME<|message|>`


Piece = tuple[PieceKind, str]


class ReasoningStream:
    """Splits generated text into reasoning and answer pieces for one syntax (not thread-safe).

    `push` returns what is certain now; `finish` returns the rest (an open thinking block stays thinking).
    `thinking` says whether the text pushed so far ended inside the thinking.
    """

    def __init__(self, syntax: ReasoningSyntax, start: Start = "open") -> None:
        self._syntax = syntax
        self._held = ""
        self._channel = ""
        self._call = False  # harmony: inside a message to a function, shown whole as answer
        if syntax.format == "none" or (start == "answer" and syntax.format != "harmony"):
            self._state = _State.ANSWER
        elif start == "answer":  # harmony: the prompt opened the final channel; later messages may follow
            self._state, self._channel = _State.THINKING, "final"
        elif start == "thinking":
            self._state = _State.THINKING
        else:
            self._state = _State.START

    @property
    def thinking(self) -> bool:
        if self._state is _State.HEADER:  # a header is thinking until it shows it opens no analysis message
            return not any(mark in self._held for mark in _ANSWER_HEADERS)
        if self._state is _State.THINKING:
            return self._channel != "final"
        return self._state is _State.START and self._syntax.format == "harmony"

    def push(self, text: str) -> list[Piece]:
        self._held += text
        out: list[Piece] = []
        while self._held:
            before = (self._state, len(self._held))
            self._step(out)
            if (self._state, len(self._held)) == before:
                break  # waiting for more text
        return _merge(out)

    def finish(self) -> list[Piece]:
        held, self._held = self._held, ""
        if not held:
            return []
        if self._state is _State.HEADER and HARMONY_CHANNEL not in held:
            return [("content", held)]  # plain text where a header was expected
        if self.thinking:
            return [("reasoning", held)]
        if self._state is _State.AFTER_CLOSE:
            held = held.lstrip()
        return [("content", held)] if held else []

    def _step(self, out: list[Piece]) -> None:
        if self._state is _State.ANSWER:
            out.append(("content", self._held))
            self._held = ""
        elif self._state is _State.START:
            self._start()
        elif self._state is _State.AFTER_CLOSE:
            stripped = self._held.lstrip()
            if stripped:
                self._held, self._state = stripped, _State.ANSWER
            else:
                self._held = ""
        elif self._state is _State.THINKING:
            self._thinking(out)
        else:
            self._header(out)

    def _start(self) -> None:
        if self._syntax.format == "harmony":
            self._state = _State.HEADER
            return
        stripped = self._held.lstrip()
        if stripped.startswith(THINK_OPEN):
            self._held, self._state = stripped[len(THINK_OPEN) :].lstrip("\n"), _State.THINKING
        elif not THINK_OPEN.startswith(stripped):
            self._state = _State.ANSWER  # the model answered without thinking

    def _thinking(self, out: list[Piece]) -> None:
        ends = HARMONY_ENDS if self._syntax.format == "harmony" else (THINK_CLOSE,)
        kind: PieceKind = "reasoning" if self.thinking else "content"
        at, tag = _first(self._held, ends)
        if tag is not None:
            body = self._held[:at] + (tag if self._call else "")
            if body:
                out.append((kind, body))
            self._held = self._held[at + len(tag) :]
            self._state = _State.HEADER if self._syntax.format == "harmony" else _State.AFTER_CLOSE
            self._channel, self._call = "", False
            return
        keep = max(_partial_suffix(self._held, tag) for tag in ends)
        ready, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        if ready:
            out.append((kind, ready))

    def _header(self, out: list[Piece]) -> None:
        """Harmony: `[<|start|>assistant]<|channel|>NAME[ to=...][<|constrain|>...]<|message|>`."""
        at = self._held.find(HARMONY_MESSAGE)
        if at < 0:
            if len(self._held) > HARMONY_HEADER_LIMIT:
                self._state = _State.ANSWER
            return
        header, self._held = self._held[:at], self._held[at + len(HARMONY_MESSAGE) :]
        channel = header.split(HARMONY_CHANNEL, 1)[1] if HARMONY_CHANNEL in header else ""
        self._channel = channel.split()[0] if channel.split() else ""
        if recipient(header) is not None:  # a tool call: the tool parser reads the whole message
            opening = "" if HARMONY_START in header else HARMONY_START + "assistant"
            out.append(("content", opening + header + HARMONY_MESSAGE))
            self._channel, self._call = "final", True
        elif self._channel not in ("analysis", "final"):
            self._channel = "final"  # a preamble (commentary to no one), or another channel: answer text
        self._state = _State.THINKING


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str | None]:
    found = [(text.find(tag), tag) for tag in tags if tag in text]
    if not found:
        return -1, None
    at, tag = min(found)
    return at, tag


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _merge(pieces: list[Piece]) -> list[Piece]:
    merged: list[Piece] = []
    for kind, text in pieces:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged
