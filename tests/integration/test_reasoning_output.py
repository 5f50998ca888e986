"""`ChatOutput` with a reasoning syntax: thinking in `reasoning_content`, its tokens counted, stop strings and
tool calls read from the answer only (pure Python, but the tool formats import llama.cpp's grammar code)."""

from __future__ import annotations

from backends.llamacpp.worker.output import ChatOutput, assemble, reasoning_text
from backends.llamacpp.worker.reasoning import ReasoningStream, ReasoningSyntax
from backends.llamacpp.worker.tools import select_format
from tests.fixtures.gguf_templates import template_text

DEEPSEEK = ReasoningSyntax("deepseek")


def test_chat_output_puts_thinking_in_reasoning_content_and_counts_its_tokens() -> None:
    output = ChatOutput(None, (), reasoning=ReasoningStream(DEEPSEEK, "thinking"))
    deltas = [d for token in ["I", " think", "</think>", "\n\n", "Yes", "."] for d in output.push(token)]
    deltas += output.finish()
    assert reasoning_text(deltas) == "I think"
    assert assemble(deltas) == ("Yes.", [])
    assert output.reasoning_tokens == 3  # "I", " think" and the token that closed the block


def test_stop_strings_apply_to_the_answer_only() -> None:
    output = ChatOutput(None, (), reasoning=ReasoningStream(DEEPSEEK, "thinking"), stops=("STOP",))
    deltas = [d for token in ["say STOP", " later</think>", "ok ST", "OP more"] for d in output.push(token)]
    assert reasoning_text(deltas) == "say STOP later"
    assert assemble(deltas)[0] == "ok "
    assert output.done and output.matched == "STOP"


def test_a_tool_call_written_while_thinking_is_not_a_call() -> None:
    fmt = select_format(template_text("qwen3"))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    output = ChatOutput(fmt, ("get_weather",), reasoning=ReasoningStream(DEEPSEEK, "open"))
    deltas = [d for piece in ["<think>maybe ", call, "</think>\n\n", call] for d in output.push(piece)]
    deltas += output.finish()
    content, calls = assemble(deltas)
    assert reasoning_text(deltas) == "maybe " + call
    assert [c["function"]["name"] for c in calls] == ["get_weather"] and content is None
