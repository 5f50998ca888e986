"""Strict numbers on every route that takes a count (issue 35, item 6): a JSON boolean is not 1, a float is
not a token id, `seed` fits int64, and output limits are bounded, each a 400 naming the parameter.

In-process: the model is refused at placement, so a body that passes validation gets the refused model's
503 and one that does not gets its 400 (`tests.unit.test_hostile_inputs.gateway`). The limit over the
model's context needs a served model: `tests/e2e/test_hostile_clients.py`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.protocol.engine_requests import EngineTarget
from tests.unit.test_hostile_inputs import ANTHROPIC, VALID, checked, gateway, post

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": False}, "max_completion_tokens"),
    ("/v1/chat/completions", {"max_tokens": 2.0}, "max_tokens"),
    ("/v1/chat/completions", {"n": True}, "n"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {"top_k": True}, "top_k"),
    ("/v1/chat/completions", {"seed": 2**64}, "seed"),
    ("/v1/chat/completions", {"seed": -(2**63) - 1}, "seed"),
    ("/v1/chat/completions", {"seed": True}, "seed"),
    ("/v1/chat/completions", {"max_tokens": 2**63}, "max_tokens"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"best_of": True}, "best_of"),
    ("/v1/embeddings", {"input": [True, False, True]}, "input"),
    ("/v1/embeddings", {"input": [0.0]}, "input"),
    ("/v1/embeddings", {"input": [[1, 2.5]]}, "input"),
    ("/v1/embeddings", {"dimensions": True}, "dimensions"),
    ("/v1/responses", {"max_output_tokens": 2**63}, "max_output_tokens"),
    ("/v1/responses", {"max_output_tokens": True}, "max_output_tokens"),
    ("/v1/messages", {"max_tokens": True}, "max_tokens"),
    ("/v1/messages", {"top_k": False}, "top_k"),
]


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway(tmp_path) as client:
        yield client


@pytest.mark.parametrize(("path", "change", "param"), CASES, ids=[f"{p}-{json.dumps(c)}" for p, c, _ in CASES])
async def test_lax_numbers_are_400_naming_the_parameter(
    http: httpx.AsyncClient, path: str, change: dict[str, Any], param: str
) -> None:
    response = await post(http, path, json.dumps({**VALID[path], **change}).encode())
    error = checked(path, response)
    assert response.status_code == 400, response.text
    if path not in ANTHROPIC:  # Anthropic's envelope has no `param`: the message names it
        assert error["param"] is not None and error["param"].startswith(param), error
    assert param in error["message"], error


@pytest.mark.parametrize(
    ("path", "change"),
    [("/v1/chat/completions", {"seed": 2**63 - 1, "max_tokens": 1, "n": 1}), ("/v1/embeddings", {"input": [1, 2]}),
     ("/v1/embeddings", {"input": [[1], [2, 3]]}), ("/v1/chat/completions", {"seed": -(2**63)})],
)  # fmt: skip
async def test_strict_numbers_still_take_integers(http: httpx.AsyncClient, path: str, change: dict[str, Any]) -> None:
    response = await post(http, path, json.dumps({**VALID[path], **change}).encode())
    checked(path, response)
    assert response.status_code == 503, response.text  # valid: it reached the (refused) model


def test_a_limit_over_the_context_is_a_400_naming_the_parameter() -> None:
    target = EngineTarget(model="m", max_tokens_cap=8192, clamp=True, context_tokens=4096)
    assert target.max_tokens(4096) == 4096
    with pytest.raises(Exception, match="max_output_tokens is too large: 4097") as caught:
        target.max_tokens(4097, "max_output_tokens")
    assert getattr(caught.value, "param", None) == "max_output_tokens"
    assert EngineTarget(model="m", max_tokens_cap=100, clamp=True, context_tokens=4096).max_tokens(200) == 100
