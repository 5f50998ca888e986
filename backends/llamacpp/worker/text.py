"""Text on both sides of the model: chat templates in, incremental detokenization and stop strings out."""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# llama.cpp's own fallback when a GGUF carries no `tokenizer.chat_template`.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(Exception):
    """The model's chat template refused the conversation (e.g. `raise_exception` on role order)."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """`transformers`' `tojson`: plain JSON in the given key order. Jinja's own sorts keys and returns
    HTML-escaped Markup, which templates that concatenate it with strings (Mistral's) turn into `&#34;`."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A Hugging Face style Jinja chat template, rendered in a sandbox like `transformers` does."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._system_role: bool | None = None

    @property
    def supports_system_role(self) -> bool:
        """Whether the template renders a system message (Gemma 2's, for one, raises on it instead).

        Found by rendering a probe conversation once, as llama.cpp's minja does to learn a template's
        capabilities.
        """
        if self._system_role is None:
            probe = "<system-probe>"
            try:
                text = self.render(
                    [{"role": "system", "content": probe}, {"role": "user", "content": "hi"}],
                    add_generation_prompt=False,
                )
            except ChatTemplateError:
                text = ""
            self._system_role = probe in text
        return self._system_role

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages`, by default ending with the assistant's generation prompt.

        `tools` (OpenAI-shaped dicts) is passed to the template only when given: templates test
        `tools is defined` or `if tools`. `continue_final` leaves the last message open instead, so the
        model continues it: the rendering is cut right after that message's content (as `transformers`'
        `continue_final_message` does); it is an error if the template does not write the content verbatim.
        `extra` (a request's `chat_template_kwargs`, e.g. `enable_thinking`) adds template variables; it
        cannot replace the conversation, the tools or the special tokens.
        """
        context: dict[str, Any] = {k: v for k, v in (extra or {}).items() if k != "tools"}
        context |= {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt and not continue_final,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if tools is not None:
            context["tools"] = list(tools)
        try:
            text = self._template.render(**context)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        except TypeError as exc:  # template arithmetic on the conversation's values, e.g. `'a' + none`
            raise ChatTemplateError(f"chat template failed on this conversation: {exc}") from exc
        return _cut_after_final(text, messages) if continue_final else text


def _cut_after_final(text: str, messages: Sequence[dict[str, Any]]) -> str:
    """`text` up to the end of the last message's content, for the model to continue it."""
    final = messages[-1].get("content") if messages else None
    if not isinstance(final, str) or not final.strip():
        raise ChatTemplateError("the final message has no text to continue")
    for candidate in (final, final.strip()):
        at = text.rfind(candidate)
        if at >= 0:
            return text[: at + len(candidate)]
    raise ChatTemplateError("the chat template does not render the final message's text as it is")


class Utf8Stream:
    """Joins token byte pieces into text without ever splitting a multi-byte character.

    A token may end in the middle of a UTF-8 sequence; those bytes wait for the next piece. Invalid
    bytes become U+FFFD. A character still incomplete when generation ends (max_tokens cut it) is
    dropped rather than shown as U+FFFD.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        return str(self._decoder.decode(piece))

    def flush(self) -> str:
        self._decoder.reset()
        return ""


@dataclass(frozen=True)
class StopResult:
    """What may be sent now, and the stop string that ended the text (None while none has)."""

    text: str
    matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None


class StopMatcher:
    """Finds stop strings in generated text and holds back anything that might be the start of one.

    Text is released only once it can no longer become part of a stop string, so a stream never shows
    a partial stop string that later has to be retracted. The stop string itself is never released; the
    result names it (`StopResult.matched`): the one that starts first in the text, or of those starting at
    the same place, the one the request listed first.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> StopResult:
        if not self._stops:
            return StopResult(text)
        buffer = self._held + text
        found = [(at, order) for order, at in enumerate(buffer.find(s) for s in self._stops) if at >= 0]
        if found:
            at, order = min(found)
            self._held = ""
            return StopResult(buffer[:at], self._stops[order])
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :]
        return StopResult(buffer[: len(buffer) - keep])

    def flush(self) -> str:
        """The held-back text, when generation ends for a reason other than a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest
