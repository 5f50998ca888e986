"""From an engine request to prompt tokens and a grammar: the GGUF's chat template, tools, JSON output.

The model's tool format is chosen once, from its chat template (`tools.select_format`): a template that
renders tools itself gets them (and the history's tool calls) in its own way, and its native call syntax
is parsed back; any other template gets a system-prompt section describing the tools and a generic
`<tool_call>` syntax. `tool_choice` "required" or a named tool is enforced with a grammar that only
admits well-formed calls whose arguments follow the tool's schema; "none" renders no tools at all.

A request with images (a worker started with `--mmproj`) is rendered the same way, with the media
marker where each image was; the projector then tokenizes the text around the markers and preprocesses
each image into its chunk (`vision.VisionProjector.tokenize`), and the prompt's token list holds a
placeholder id at each image position (`vision.cache_tokens`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from backends.llamacpp.worker.native import Model
from backends.llamacpp.worker.prompt_tokens import Lru, PieceTokenizer, checked_tokenizer
from backends.llamacpp.worker.reasoning import (
    HARMONY_ANALYSIS,
    HARMONY_CALL_OPEN,
    NO_REASONING,
    THINK_OPEN,
    ReasoningSyntax,
    Start,
    ThinkingBudget,
    after_thinking,
    select_reasoning,
)
from backends.llamacpp.worker.text import CHATML_TEMPLATE, ChatTemplate
from backends.llamacpp.worker.tickets import ImageSpan
from backends.llamacpp.worker.tools import SchemaGrammarError, ToolFormat, select_format
from backends.llamacpp.worker.vision import ImageChunk, RgbImage, VisionError, VisionProjector, cache_tokens
from backends.llamacpp.worker.wire import format_grammar
from backends.request import IMAGE_MARKER, EngineImage, EngineRequest, NamedToolChoice, Tool

log = logging.getLogger("voltgate.worker")

TOOL_GRAMMARS = 16
"""Tool grammars kept (`PromptBuilder._tool_grammar`): a few agents' tool sets, each with and without a forced call."""


def _one(_: object) -> int:
    return 1


def _sample_messages(system_role: bool) -> list[dict[str, str]]:
    """A short conversation to find a template's message markers by (`PromptBuilder._piece_tokenizer`)."""
    text = "The quick brown fox jumps over the lazy dog. " * 3
    turns = [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    head = [{"role": "system", "content": text}] if system_role else []
    return [*head, *turns, *turns, {"role": "user", "content": text}]


class PromptError(Exception):
    """The request cannot be turned into a prompt (e.g. a JSON schema no grammar can express)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Prepared:
    tokens: list[int]
    grammar: str | None = None
    tool_format: ToolFormat | None = None
    tool_names: tuple[str, ...] = ()
    shown_specials: frozenset[int] = frozenset()
    grammar_triggers: tuple[str, ...] = ()
    forced_call: bool = False  # `grammar` forces a call (tool_choice "required" or a named tool)
    images: tuple[ImageSpan, ...] = ()
    reasoning: ReasoningSyntax = NO_REASONING
    reasoning_start: Start = "answer"  # where the output begins (`ReasoningStream`)
    thinking_budget: ThinkingBudget | None = None

    @property
    def image_tokens(self) -> int:
        return sum(image.n_tokens for image in self.images)


class PromptBuilder:
    """Thread-safe (read-only after construction): `prepare` runs off the event loop."""

    def __init__(self, model: Model, projector: VisionProjector | None = None) -> None:
        self._model = model
        self._projector = projector
        source = model.chat_template() or CHATML_TEMPLATE
        self._bos_text = model.special_text(model.bos_id)
        eos_text = model.special_text(model.eos_id)
        self.template = ChatTemplate(source, bos_token=self._bos_text, eos_token=eos_text)
        # Some GGUFs (Hermes 2 Pro) carry a second template for conversations with tools.
        tool_source = model.chat_template("tool_use")
        self.tool_template = (
            ChatTemplate(tool_source, bos_token=self._bos_text, eos_token=eos_text) if tool_source else self.template
        )
        self.tool_format = select_format(tool_source or source)
        self.reasoning = select_reasoning(source)
        self._specials = self._special_ids(self.tool_format.preserved_tokens)
        self._thinking_specials = self._special_ids(self.reasoning.preserved_tokens)
        self.pieces = self._piece_tokenizer()
        self._tool_grammars: Lru[tuple[bool, bool, str], tuple[str, tuple[str, ...]]] = Lru(TOOL_GRAMMARS, _one)

    def _piece_tokenizer(self) -> PieceTokenizer:
        """The prompt's tokenizer: whole texts, or cut before the template's message markers (`prompt_tokens`)."""
        model = self._model

        def whole(text: str, add_special: bool) -> list[int]:
            return model.tokenize(text, add_special=add_special)

        sample = None
        if model.cuttable:
            try:
                sample = self.template.render(_sample_messages(self.template.supports_system_role))
            except Exception as exc:  # a template that refuses the sample (or breaks on it): no cuts, no failure
                log.info("the chat template refused a sample conversation (%s): prompts are tokenized whole", exc)
        pieces = checked_tokenizer(whole, sample, model.specials() if sample else {})
        log.info("prompts tokenized %s", f"in pieces before {list(pieces.anchors)}" if pieces.anchors else "whole")
        return pieces

    def _special_ids(self, texts: tuple[str, ...]) -> frozenset[int]:
        """The token ids of a tool syntax's markers that are special tokens (rendered empty by default)."""
        ids = set()
        for text in texts:
            tokens = self._model.tokenize(text, add_special=False, parse_special=True)
            if len(tokens) == 1 and not self._model.piece(tokens[0]):
                ids.add(tokens[0])
        return frozenset(ids)

    def prepare(self, request: EngineRequest) -> Prepared:
        """Prompt tokens and grammar for `request` (blocking: tokenization is native code)."""
        if request.messages is None:
            return Prepared(self._tokens(request.prompt or "", self._model.add_bos))
        tools = request.active_tools
        fmt = self.tool_format
        template = self.tool_template if tools else self.template
        messages = fmt.prepare_messages(request.messages, tools, system_role=template.supports_system_role)
        text = template.render(
            messages,
            tools=fmt.tools_for_template(tools) if tools and fmt.native else None,
            add_generation_prompt=not request.continue_final_message,
            continue_final=request.continue_final_message,
            extra=self._template_kwargs(request),
        )
        text, start = self._thinking_prompt(text, request)
        # Templates that write the BOS token themselves must not get a second one.
        add_bos = self._model.add_bos and not (self._bos_text and text.startswith(self._bos_text))
        images: tuple[ImageSpan, ...] = ()
        if request.images:
            tokens, images = self._with_images(text, add_bos, request.images)
        else:
            tokens = self._tokens(text, add_bos)
        if not tools:
            try:
                grammar = format_grammar(request)
            except SchemaGrammarError as exc:
                raise PromptError(f"response_format.json_schema: {exc}", "response_format") from exc
            grammar, triggers = after_thinking(grammar, (), self.reasoning, start, final_message=True)
            return self._prepared(tokens, grammar, start, request, triggers=triggers, images=images)
        parallel = request.parallel_tool_calls is not False
        forced = request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice)
        if forced:  # with a budget of 0 the grammar admits no thinking (harmony: the prompt skipped none)
            grammar_start = "answer" if request.thinking_budget_tokens == 0 else start
            grammar, triggers = after_thinking(
                *self._tool_grammar(tools, parallel, True), self.reasoning, grammar_start
            )
        else:  # "auto": free text, but a call, once opened, is held to the tools' schemas
            grammar, triggers = after_thinking(*self._tool_grammar(tools, parallel, False), self.reasoning, start)
        names = tuple(t.function.name for t in tools)
        tools_of = (fmt, names, forced)
        return self._prepared(tokens, grammar, start, request, triggers=triggers, images=images, tools=tools_of)

    def _tool_grammar(self, tools: Sequence[Tool], parallel: bool, forced: bool) -> tuple[str, tuple[str, ...]]:
        """The tools' call grammar (forced: with no trigger; else lazy, with its triggers), kept by the tools'
        JSON: an agent sends the same tools every turn, and turning their schemas into a grammar took Claude
        Code's 7 ms a turn on a CI core (`bench/results/2026-12-06-turn-overhead-cpu/`)."""
        key = (parallel, forced, "\n".join(tool.model_dump_json() for tool in tools))
        kept = self._tool_grammars.get(key)
        if kept is None:
            fmt = self.tool_format
            kept = (fmt.grammar(tools, parallel=parallel), ()) if forced else fmt.lazy_grammar(tools, parallel)
            self._tool_grammars.put(key, kept)
        return kept

    def _prepared(
        self,
        tokens: list[int],
        grammar: str | None,
        start: Start,
        request: EngineRequest,
        *,
        triggers: tuple[str, ...],
        images: tuple[ImageSpan, ...],
        tools: tuple[ToolFormat, tuple[str, ...], bool] | None = None,
    ) -> Prepared:
        fmt, names, forced = tools if tools is not None else (None, (), False)
        closing = HARMONY_CALL_OPEN if tools is not None and self.reasoning.format == "harmony" else None
        return Prepared(
            tokens,
            grammar,
            fmt,
            names,
            (self._specials if tools is not None else frozenset()) | self._thinking_specials,
            triggers,
            forced_call=forced,
            images=images,
            reasoning=self.reasoning,
            reasoning_start=start,
            thinking_budget=self._budget(request, start, closing),
        )

    def _budget(self, request: EngineRequest, start: Start, closing_text: str | None) -> ThinkingBudget | None:
        """The engine's thinking budget for a limit N > 0 where the output may think; it closes the thinking
        with the request's budget message (text the model reads as its own last thought, like llama-server's
        `--reasoning-budget-message`), then `closing_text` (harmony with tools: a new assistant message, which
        may be a call), else the family's closing (into the answer)."""
        limit = request.thinking_budget_tokens
        if not limit or start == "answer":
            return None
        text = (request.thinking_budget_message or "") + (closing_text or self.reasoning.closing)
        closing = self._model.tokenize(text, add_special=False, parse_special=True)
        return ThinkingBudget(limit, tuple(closing), self.reasoning, start)

    def _template_kwargs(self, request: EngineRequest) -> dict[str, object]:
        """The request's `chat_template_kwargs`; with a thinking budget of 0, the template's own switch
        (`enable_thinking: false`) unless the request set it."""
        kwargs = dict(request.chat_template_kwargs or {})
        switch = self.reasoning.switch
        if request.thinking_budget_tokens == 0 and switch is not None:
            kwargs.setdefault(switch, False)
        return kwargs

    def _thinking_prompt(self, text: str, request: EngineRequest) -> tuple[str, Start]:
        """The rendered prompt, made to skip the thinking for a budget of 0 (the closing appended when the
        template had no switch or did not use it), or to open it where a grammar must wait for its end;
        and where the output then begins."""
        if request.continue_final_message or not self.reasoning.enabled:
            return text, "answer"
        start = self.reasoning.start(text)
        forced = request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice)
        forced_call = forced and bool(request.active_tools)
        if request.thinking_budget_tokens == 0 and forced_call and self.reasoning.format == "harmony":
            return text, start  # skipping would open the final channel, where no call is made: the grammar skips
        if request.thinking_budget_tokens == 0:
            return text + self.reasoning.skip(start), "answer"
        structured = request.response_format is not None and request.response_format.type != "text"
        needs_grammar = forced_call or structured
        if needs_grammar and start == "open" and self.reasoning.format == "deepseek":
            return text + THINK_OPEN + "\n", "thinking"
        if request.thinking_budget_tokens and start == "open" and self.reasoning.format == "harmony":
            return text + HARMONY_ANALYSIS, "thinking"  # the budget counts the analysis channel from here
        return text, start

    def _with_images(
        self, text: str, add_bos: bool, images: Sequence[EngineImage]
    ) -> tuple[list[int], tuple[ImageSpan, ...]]:
        """The prompt's tokens (a placeholder id at each image position) and its images' spans."""
        if self._projector is None:
            raise PromptError("this model does not accept images (capability vision: it has no mmproj)", "messages")
        text = text.replace(IMAGE_MARKER, self._projector.marker)
        try:
            pixels = [RgbImage.from_encoded(image.raw()) for image in images]
        except Exception as exc:  # Pillow raises several types for a broken file
            raise PromptError(f"an image could not be decoded: {exc}", "messages") from exc
        try:
            prompt = self._projector.tokenize(text, pixels, add_special=add_bos)
        except VisionError as exc:
            raise PromptError(str(exc), "messages") from exc
        spans: list[ImageSpan] = []
        start = 0
        for chunk in prompt.chunks:
            if isinstance(chunk, ImageChunk):
                spans.append(ImageSpan(start, chunk.n_tokens, chunk, prompt))
            start += chunk.n_tokens
        tokens = cache_tokens(prompt)
        if spans and spans[-1].end >= len(tokens):
            raise PromptError("the prompt must not end with an image", "messages")
        return tokens, tuple(spans)

    def _tokens(self, text: str, add_bos: bool) -> list[int]:
        """`text`'s tokens through the piece tokenizer (a raw completion prompt too: exact by the same rule)."""
        tokens = self.pieces(text, add_bos)
        if not tokens and self._model.bos_id >= 0:
            tokens = [self._model.bos_id]
        return tokens
