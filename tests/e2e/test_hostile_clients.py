"""Hostile clients against the real gateway and the real SmolLM2 worker (issue 35, items 2 and 6): a prompt
whose bytes cannot fit the context is refused before tokenization, other clients are served meanwhile, the
gateway's memory comes back after a burst of huge bodies, and an output limit over the context is a 400
naming the parameter. The slow-body and connection cases: tests/integration/test_server_connections.py.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONTEXT = 4096
HUGE_TEXT = "lorem ipsum dolor sit amet " * 300_000  # 8.1 MB: ~2 M tokens, refused by its bytes alone
BURST = 4


@pytest.fixture(scope="module")
def big_bodies(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The gateway with room for large bodies (the shared one allows 64 KiB)."""
    tmp = tmp_path_factory.mktemp("hostile")
    models = [model_entry(smollm2_path, context=CONTEXT)]
    config = write_config(tmp, smollm2_path, free_port(), models=models, max_body_bytes=32 << 20)
    with running_gateway(config, tmp / "gateway.log") as gw:
        yield gw


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def huge_chat(gw: Gateway) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": HUGE_TEXT}], "max_tokens": 4}
    return httpx.post(gw.base_url + "/chat/completions", json=body, timeout=300)


def small_chat(gw: Gateway) -> str:
    reply = gw.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


def test_a_prompt_too_long_in_bytes_is_refused_before_tokenization(big_bodies: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        big_bodies.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": HUGE_TEXT}], max_tokens=4
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded", error
    assert f"maximum context length is {CONTEXT} tokens" in error["message"], error
    assert "before tokenization" in error["message"], error
    assert error["param"] == "messages"


def test_a_burst_of_huge_prompts_leaves_others_served_and_memory_returned(big_bodies: Gateway) -> None:
    small_chat(big_bodies)  # warm: the idle gateway has served a request
    idle = rss_bytes(big_bodies.process.pid)
    with concurrent.futures.ThreadPoolExecutor(BURST + 1) as pool:
        huge = [pool.submit(huge_chat, big_bodies) for _ in range(BURST)]
        small = pool.submit(small_chat, big_bodies)
        assert small.result(timeout=300) is not None
        statuses = [f.result(timeout=300).status_code for f in huge]
    assert statuses == [400] * BURST
    deadline = time.monotonic() + 10
    while rss_bytes(big_bodies.process.pid) > 2 * idle:  # the trim runs as each request ends
        assert time.monotonic() < deadline, (rss_bytes(big_bodies.process.pid), idle)
        time.sleep(0.2)


def test_an_output_limit_over_the_context_is_a_400_naming_it(big_bodies: Gateway) -> None:
    client = big_bodies.client()
    for params, name in [({"max_tokens": CONTEXT + 1}, "max_tokens"),
                         ({"max_completion_tokens": 2**31 - 1}, "max_completion_tokens")]:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], **params)  # type: ignore[call-overload]
        error = caught.value.body
        assert isinstance(error, dict) and error["param"] == name and "too large" in error["message"], error
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=CONTEXT + 1)
    assert isinstance(responses.value.body, dict) and responses.value.body["param"] == "max_output_tokens"
