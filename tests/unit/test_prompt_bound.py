"""The prompt byte bound (`backends.llamacpp.worker.prompt_bound`): a prompt whose texts alone are more
tokens than the context is refused before tokenization, with a lower bound that can never refuse a prompt
that fits. Native-free: a vocabulary of known pieces stands in for the model's (the real SmolLM2 vocabulary
and worker: tests/e2e/test_hostile_clients.py)."""

from __future__ import annotations

import pytest

from backends.errors import ErrorCode
from backends.llamacpp.worker.httpkit import WorkerError
from backends.llamacpp.worker.prompt_bound import check_prompt_bytes, longest_token_bytes, text_bytes
from backends.overflow import overflow_counts
from backends.request import IMAGE_MARKER, EngineRequest


class Pieces:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.n_vocab = len(pieces)

    def piece(self, token: int, *, special: bool = False) -> bytes:
        return self.pieces[token]


def chat(*texts: str) -> EngineRequest:
    return EngineRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": t} for t in texts]})


def test_the_longest_piece_counts_special_tokens_as_their_text() -> None:
    assert longest_token_bytes(Pieces([b"a", b"<|im_start|>", b"hello"])) == 12
    assert longest_token_bytes(Pieces([b""])) == 1


def test_text_bytes_count_utf8_and_leave_image_markers_out() -> None:
    assert text_bytes(chat("héllo", f"a{IMAGE_MARKER}b")) == 6 + 2
    assert text_bytes(EngineRequest.model_validate({"model": "m", "prompt": "ab"})) == 2


def test_a_prompt_over_the_bound_is_refused_in_openais_words() -> None:
    with pytest.raises(WorkerError) as caught:
        check_prompt_bytes(chat("x" * 4096 * 8), longest=8, context=4096)
    assert caught.value.code is ErrorCode.CONTEXT_LENGTH_EXCEEDED and caught.value.param == "messages"
    assert overflow_counts(str(caught.value)) == (4096, 4096)  # clients parse these counts
    assert "before tokenization" in str(caught.value)


def test_a_prompt_that_may_fit_is_left_to_the_tokenizer() -> None:
    check_prompt_bytes(chat("x" * (4095 * 8)), longest=8, context=4096)  # at least 4095 tokens: may fit
    check_prompt_bytes(chat("x" * 10_000), longest=1, context=20_000)
