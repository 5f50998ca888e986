"""Tool-call formats: one per model family, picked from the chat template's text by `select_format`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from backends.llamacpp.worker.tools import grammar as gbnf
from backends.llamacpp.worker.tools import messages as msgs
from backends.llamacpp.worker.tools.calls import ParsedOutput
from backends.llamacpp.worker.tools.harmony import HarmonySyntax
from backends.llamacpp.worker.tools.llama3 import PYTHON_TAG, Llama3Syntax
from backends.llamacpp.worker.tools.syntax import CallSyntax, HermesSyntax, MistralSyntax, parse_output
from backends.request import EngineMessage, Tool


def full_match(pattern: str) -> str:
    """A lazy-grammar trigger pattern that must match all the text generated so far: llama.cpp searches a
    pattern anywhere in it unless it starts with `^` and ends with `$`."""
    return "^" + pattern + "$"


def escaped(text: str) -> str:
    """`text` as a literal in a trigger pattern (std::regex ECMAScript and Python's `re` alike)."""
    controls = {"\n": r"\n", "\t": r"\t", "\r": r"\r"}
    return "".join("\\" + c if c in r"\^$.|?*+()[]{}" else controls.get(c, c) for c in text)


def _prefixes(text: str) -> str:
    """A pattern for any prefix of `text`, the empty one included."""
    pattern = ""
    for c in reversed(text):
        pattern = f"(?:{escaped(c)}{pattern})?"
    return pattern


def may_follow(head: str, names: Iterable[str] = ()) -> str:
    """A pattern for what may follow a trigger word in the token that completes it: a prefix of `head`
    then of one of `names` (what the grammar holds next).

    Once a pattern fires, llama.cpp replays the text from its capture group into the grammar, and text the
    grammar refuses throws a C++ exception that cannot cross our ctypes call: the worker aborts (a token
    like `></` right after `<tool_call`). So a trigger fires only where that text is a prefix of what the
    grammar holds; a token that runs further leaves the text free, and the parser reads it as written."""
    alternatives = "|".join(_prefixes(name) for name in names)
    if not alternatives:
        return _prefixes(head)
    return f"(?:{escaped(head)}(?:{alternatives})|{_prefixes(head)})"


def _word_pattern(word: str, rest: str) -> str:
    """A lazy-grammar trigger pattern (matched against all text generated so far) that fires at `word`
    followed by text that matches `rest`: the grammar is applied from the first capture group on."""
    return full_match(rf"[\s\S]*?({escaped(word)}){rest}")


class ToolFormat(ABC):
    """How one family's models see tools and write calls.

    `native`: the chat template renders `tools`, calls and results itself; pass it `tools_for_template()`.
    Otherwise (generic) pass it no tools: `prepare_messages` has put them in the system prompt as text.
    `trigger` opens a call in free text; `preserved_tokens` are special tokens of the syntax that the worker
    must render as text (`special=True`), or neither the parser nor a lazy grammar ever sees them.
    """

    name: ClassVar[str]
    native: ClassVar[bool] = True
    trigger: ClassVar[str]
    call_head: ClassVar[str] = ""
    """What the grammar holds between `trigger` and the tool's name (canonically spaced)."""
    name_end: ClassVar[str] = ""
    """What the grammar holds right after the name."""
    preserved_tokens: ClassVar[tuple[str, ...]] = ()
    parallel_calls: ClassVar[bool] = True
    """Whether the family can make several calls in one reply (if not, `grammar` ignores `parallel`)."""

    def __init__(self, syntax: CallSyntax) -> None:
        self.syntax = syntax

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"

    def tools_for_template(self, tools: Sequence[Tool]) -> list[dict[str, Any]]:
        """The `tools` variable for a native template (OpenAI-shaped dicts)."""
        return msgs.tools_for_template(tools)

    def prepare_messages(
        self,
        messages: Sequence[EngineMessage],
        tools: Sequence[Tool],  # noqa: ARG002 (the generic format writes them into the system prompt)
        *,
        system_role: bool = True,  # noqa: ARG002 (likewise: `ChatTemplate.supports_system_role`)
    ) -> list[dict[str, Any]]:
        """The `messages` variable for the template: calls with parsed arguments, results with their ids."""
        return msgs.template_messages(messages)

    @abstractmethod
    def grammar(self, tools: Sequence[Tool], *, parallel: bool) -> str:
        """GBNF forcing one call (or, with `parallel`, one or more) of `tools` in this family's syntax,
        each call's arguments conforming to its tool's `parameters` schema. For tool_choice "required"
        and a named tool (pass only that one)."""

    def trigger_patterns(self, names: Sequence[str]) -> tuple[str, ...]:
        """Regexes (std::regex ECMAScript, full match over the text so far: `^...$`) that start a lazy
        grammar for tools named `names`."""
        return (_word_pattern(self.trigger, self._may_follow(names)),)

    def _may_follow(self, names: Sequence[str]) -> str:
        return may_follow(self.call_head, [name + self.name_end for name in names])

    def lazy_grammar(self, tools: Sequence[Tool], parallel: bool) -> tuple[str, tuple[str, ...]]:
        """`grammar(tools)` and the trigger patterns for `llama_sampler_init_grammar_lazy_patterns`: free
        text until a call opens, then the call is held to the grammar (tool_choice "auto")."""
        return self.grammar(tools, parallel=parallel), self.trigger_patterns([t.function.name for t in tools])

    def parse(self, text: str, tool_names: Iterable[str]) -> ParsedOutput:
        """The calls in a finished generation and the text around them.

        Never raises. A malformed or truncated call, or a call of a tool not in `tool_names`, makes the
        whole text content with no calls: the user sees what the model wrote.
        """
        return parse_output(self.syntax, text, frozenset(tool_names))


class HermesFormat(ToolFormat):
    """Hermes 2 Pro / Hermes 3, Qwen2.5 (and Qwen3): `<tool_call>{json}</tool_call>` blocks."""

    name = "hermes"
    trigger = HermesSyntax.OPEN
    call_head = '\n{"name": "'
    name_end = '"'
    preserved_tokens = (HermesSyntax.OPEN, HermesSyntax.CLOSE)

    def grammar(self, tools: Sequence[Tool], *, parallel: bool) -> str:
        return gbnf.hermes_grammar(tools, parallel=parallel)


class GenericFormat(HermesFormat):
    """Any template without (known) tool support: the Hermes syntax, taught by a system-prompt section."""

    name = "generic"
    native = False

    def prepare_messages(
        self, messages: Sequence[EngineMessage], tools: Sequence[Tool], *, system_role: bool = True
    ) -> list[dict[str, Any]]:
        """Only system, user and assistant turns: calls and results as text, the tools described in the
        system prompt, or in the first user message for a template without a system role."""
        return msgs.text_messages(messages, tools, system_role=system_role)


class Llama3Format(ToolFormat):
    """Llama 3.1 / 3.2 / 3.3: `{"name": ..., "parameters": {...}}` as the reply, or after <|python_tag|>."""

    name = "llama3"
    trigger = '{"name"'
    preserved_tokens = (PYTHON_TAG,)
    parallel_calls = False
    name_end = '"'

    def prepare_messages(
        self,
        messages: Sequence[EngineMessage],
        tools: Sequence[Tool],  # noqa: ARG002
        *,
        system_role: bool = True,  # noqa: ARG002
    ) -> list[dict[str, Any]]:
        """As the base, with several calls of one assistant turn split into one turn each."""
        return msgs.one_call_per_message(msgs.template_messages(messages))

    def grammar(self, tools: Sequence[Tool], *, parallel: bool) -> str:  # noqa: ARG002 (one call per turn)
        return gbnf.llama3_grammar(tools)

    def trigger_patterns(self, names: Sequence[str]) -> tuple[str, ...]:
        # Only a reply that opens with the call's JSON (spaced as the grammar allows) is a call.
        return (full_match(r'\s*(\{ ?"name" ?: ?")' + self._may_follow(names)),)


class MistralFormat(ToolFormat):
    """Mistral v3 tokenizers (7B v0.3, Nemo): `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`."""

    name = "mistral"
    trigger = MistralSyntax.OPEN
    call_head = '[{"name": "'
    name_end = '"'
    preserved_tokens: ClassVar[tuple[str, ...]] = (MistralSyntax.OPEN,)

    def prepare_messages(
        self,
        messages: Sequence[EngineMessage],
        tools: Sequence[Tool],  # noqa: ARG002
        *,
        system_role: bool = True,  # noqa: ARG002
    ) -> list[dict[str, Any]]:
        """As the base, with call ids mapped to the 9 alphanumerics the templates require."""
        return msgs.template_messages(messages, msgs.short_call_id)

    def grammar(self, tools: Sequence[Tool], *, parallel: bool) -> str:
        return gbnf.mistral_list_grammar(tools, parallel=parallel)


class MistralNamedFormat(MistralFormat):
    """Mistral v11+ tokenizers (Small 3.2, Devstral, Magistral): `[TOOL_CALLS]name[ARGS]{...}` per call."""

    name = "mistral_v11"
    call_head = ""
    name_end = ""
    preserved_tokens = (MistralSyntax.OPEN, "[CALL_ID]", "[ARGS]")

    def grammar(self, tools: Sequence[Tool], *, parallel: bool) -> str:
        return gbnf.mistral_named_grammar(tools, parallel=parallel)


class HarmonyFormat(ToolFormat):
    """gpt-oss (harmony): a commentary message `to=functions.NAME` whose body is the arguments' JSON."""

    name = "harmony"
    trigger = " to=functions."
    preserved_tokens = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|end|>")
    parallel_calls = False  # `<|call|>` ends the turn: one call per reply

    def prepare_messages(
        self,
        messages: Sequence[EngineMessage],
        tools: Sequence[Tool],  # noqa: ARG002
        *,
        system_role: bool = True,  # noqa: ARG002
    ) -> list[dict[str, Any]]:
        """As the base, with one call per assistant turn, each followed by its result (the template renders
        only a turn's first call, and names a result after the call before it)."""
        return msgs.harmony_messages(msgs.template_messages(messages))

    def grammar(self, tools: Sequence[Tool], *, parallel: bool) -> str:  # noqa: ARG002 (one call per turn)
        return gbnf.harmony_grammar(tools)

    def trigger_patterns(self, names: Sequence[str]) -> tuple[str, ...]:
        # A call's header at the start of the output (the prompt ends in `<|start|>assistant`) or of a later
        # message: never inside a message's text. The grammar starts at the recipient.
        start = r"(?:[\s\S]*?<\|start\|>assistant)?"
        header = r"( to=functions\.|<\|channel\|>commentary to=functions\.)"
        return (full_match(start + header + self._may_follow(names)),)


GENERIC = GenericFormat(HermesSyntax())
HERMES = HermesFormat(HermesSyntax())
LLAMA3 = Llama3Format(Llama3Syntax())
MISTRAL = MistralFormat(MistralSyntax())
MISTRAL_V11 = MistralNamedFormat(MistralSyntax())
HARMONY = HarmonyFormat(HarmonySyntax())


def select_format(template_source: str | None) -> ToolFormat:
    """The tool format for a chat template, recognised by the markers its text contains.

    Like llama.cpp's `common_chat_templates_apply_jinja`: `<tool_call>` is Hermes/Qwen (unless the calls are
    XML `<function=...>`, which we cannot parse: generic), `[TOOL_CALLS]` is Mistral (with `[ARGS]`, the v11
    form), Llama 3 headers with the ipython role, `<|python_tag|>` or "parameters" are Llama 3.x; any
    other template, or none, gets the generic format. A harmony template (`<|channel|>` and `<|call|>`: gpt-oss)
    is harmony.
    """
    source = template_source or ""
    if "<|channel|>" in source and "<|call|>" in source:
        return HARMONY
    if "<tool_call>" in source and "<function=" not in source:
        return HERMES
    if MistralSyntax.OPEN in source:
        return MISTRAL_V11 if "[ARGS]" in source else MISTRAL
    llama_markers = ("<|start_header_id|>ipython", PYTHON_TAG, '"parameters"')
    if "<|start_header_id|>" in source and any(marker in source for marker in llama_markers):
        return LLAMA3
    return GENERIC
