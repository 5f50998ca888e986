"""The worker's prompts tokenized in pieces (`prompt_tokens`) are the tokens of the whole prompt, on the real
SmolLM2 tokenizer: recorded Claude Code, Codex and Open WebUI sessions of 8 turns, translated as the gateway
translates them, and random texts full of special tokens, their fragments and whitespace (hypothesis)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.llamacpp.worker.native import ContextOptions, Model
from backends.llamacpp.worker.prompt_tokens import PieceTokenizer
from backends.llamacpp.worker.prompts import PromptBuilder
from backends.request import EngineRequest
from bench.sessions import AgentSession, SessionKind, Turn
from gateway.config import PromptCacheSettings
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.requests import ChatCompletionRequest
from gateway.protocol.responses_api import ResponsesRequest
from gateway.serving.prompt_prefix import neutralise
from gateway.translate import messages, responses

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[Model]:
    loaded = Model(smollm2_path, ContextOptions(n_ctx_per_seq=256, n_seq_max=1, n_threads=1))
    yield loaded
    loaded.close()


def whole(model: Model, text: str, add_special: bool) -> list[int]:
    return model.tokenize(text, add_special=add_special)


def engine_request(turn: Turn) -> EngineRequest:
    """The turn's body as the gateway hands it to the worker."""
    target = EngineTarget(model="m")
    if turn.api == "messages":  # with Claude Code's billing line taken out, as the gateway does
        request = messages.to_chat(MessagesRequest.model_validate(turn.body)).to_engine(target)
        return neutralise(request, PromptCacheSettings())[0]
    if turn.api == "responses":
        return responses.to_chat(ResponsesRequest.model_validate(turn.body), []).to_engine(target)
    return ChatCompletionRequest.model_validate(turn.body).to_engine(target)


def test_smollm2s_prompts_are_cut_before_its_message_markers(model: Model) -> None:
    assert PromptBuilder(model).pieces.anchors == ("<|im_start|>", "<|im_end|>")


@pytest.mark.parametrize("kind", ["claude", "codex", "openwebui"])
def test_a_recorded_sessions_turns_tokenize_as_whole_prompts_and_reuse_the_earlier_turns(
    model: Model, kind: SessionKind
) -> None:
    cut, uncut = PromptBuilder(model), PromptBuilder(model)
    uncut.pieces = PieceTokenizer(lambda text, add: whole(model, text, add), ())
    session = AgentSession(kind, "m", max_tokens=16)
    turn = session.first_turn()
    for n in range(8):
        request = engine_request(turn)
        before = cut.pieces.tokenized
        prepared = cut.prepare(request)
        assert prepared.tokens == uncut.prepare(request).tokens, f"turn {n + 1}"
        assert prepared.grammar == uncut.prepare(request).grammar
        if n:  # from the second turn on, only the new messages are tokenized: the answer, the tool result, the
            # call's syntax around them (measured: 38-181 characters more than the new text; turn 1: 8.6-18.4k)
            assert cut.pieces.tokenized - before <= len(turn.new_text) + 256, f"turn {n + 1}"
        turn = session.next_turn(f"Done with step {n}.")
    assert cut.pieces.reused > 5 * cut.pieces.tokenized


def test_an_agents_tools_grammar_is_made_once_for_its_turns(model: Model) -> None:
    builder = PromptBuilder(model)
    session = AgentSession("claude", "m", max_tokens=16)
    first = builder.prepare(engine_request(session.first_turn()))
    second = builder.prepare(engine_request(session.next_turn("Done.")))
    assert first.grammar is not None and second.grammar is first.grammar  # the same object: kept, not remade


SPECIAL_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "start|>", "<", "|>", "<repo_name>"]
fragments = st.one_of(
    st.sampled_from(SPECIAL_TEXTS),
    st.sampled_from([" ", "\n", "\n\n", "  ", "\t", "user\n", "assistant\n"]),
    st.text(min_size=1, max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(fragments, min_size=1, max_size=60), add_special=st.booleans())
def test_any_text_tokenizes_in_pieces_as_whole(model: Model, parts: list[str], add_special: bool) -> None:
    text = "".join(parts) + "x" * 256  # past `SHORT_TEXT`: always cut
    pieces = PieceTokenizer(lambda t, add: whole(model, t, add), ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    assert pieces(text, add_special) == whole(model, text, add_special)


def test_a_raw_completion_prompt_goes_through_the_pieces_and_keeps_its_tokens(model: Model) -> None:
    builder = PromptBuilder(model)
    turn = "<|im_start|>user\n" + "Explain the cache. " * 20 + "<|im_end|>\n"
    for n in range(1, 4):  # a raw prompt that grows like a conversation: the earlier pieces come from the kept ones
        prompt = turn * n + "<|im_start|>assistant\n"
        assert builder.prepare(EngineRequest(model="m", prompt=prompt)).tokens == whole(model, prompt, model.add_bos)
    assert builder.pieces.reused > 0
