"""Keeping an agent session's prefix cacheable (gateway/serving/prompt_prefix.py): Claude Code's billing line
taken out of the recorded requests, the session key from what each client sends, both through the service to
the worker's body (a FakeEngine stands for the worker: it parses the body as the real one does)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from backends.base import EngineName, LMDeployOptions
from backends.llamacpp.worker.sampling import SamplingParams
from backends.llamacpp.worker.tickets import GenerationRequest
from backends.lmdeploy import DISABLE_METRICS
from backends.request import EngineRequest
from gateway.config import Config, PromptCacheSettings
from gateway.ops.auth import OPEN
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.serving.prompt_prefix import ResponseChains, Rule, SessionHints, hash_key, neutralise, session_key
from gateway.serving.service import RequestContext, StreamSession, UnaryResult
from gateway.translate.messages import to_chat, to_message
from tests.clients.fixtures import load
from tests.fakes.asgi_worker import Behaviour
from tests.unit.test_service import USER, Harness, _drain, _request

ON = PromptCacheSettings()
OFF = PromptCacheSettings(claude_code_billing_header=False)


def claude_request(name: str = "claude_first_turn", suffix: str | None = None) -> dict[str, Any]:
    """A recorded Claude Code /v1/messages body; `suffix` replaces the billing line's three hex digits."""
    body: dict[str, Any] = copy.deepcopy(load(name)["exchanges"][0]["body"])
    if suffix is not None:
        first = body["system"][0]
        first["text"] = first["text"].replace("cc_version=2.1.197.1c0", f"cc_version=2.1.197.{suffix}")
        first["text"] = first["text"].replace("cc_version=2.1.197.c40", f"cc_version=2.1.197.{suffix}")
    return body


def engine_request(body: dict[str, Any]) -> EngineRequest:
    return to_chat(MessagesRequest.model_validate(body)).to_engine(EngineTarget(model="w"))


@pytest.mark.parametrize("name", ["claude_first_turn", "claude_resumed", "claude_tool_round_trip"])
def test_the_billing_line_leaves_every_recorded_claude_code_request_and_nothing_else_changes(name: str) -> None:
    before = engine_request(claude_request(name))
    assert before.messages is not None and before.messages[0].content is not None
    assert before.messages[0].content.startswith("x-anthropic-billing-header: cc_version=2.1.197.")
    after, rules = neutralise(before, ON)
    assert rules == (Rule.CLAUDE_CODE_BILLING_HEADER,) and after.messages is not None
    assert after.messages[0].content == before.messages[0].content.split("\n", 1)[1]
    assert after.messages[0].content.startswith("You are a Claude agent")
    assert after.messages[1:] == before.messages[1:] and after.tools == before.tools


def test_three_billing_suffixes_give_one_prompt_and_the_switch_keeps_them_apart() -> None:
    requests = [engine_request(claude_request(suffix=s)) for s in ("1c0", "c40", "123")]
    assert len({r.model_dump_json() for r in requests}) == 3
    assert len({neutralise(r, ON)[0].model_dump_json() for r in requests}) == 1
    assert len({neutralise(r, OFF)[0].model_dump_json() for r in requests}) == 3
    assert neutralise(requests[0], OFF) == (requests[0], ())


def test_only_a_line_that_starts_with_the_header_in_a_system_message_is_taken_out() -> None:
    said = "Quote it: x-anthropic-billing-header: cc_version=1; is what Claude Code sends"
    body = {"model": "w", "messages": [{"role": "system", "content": said}, {"role": "user",
            "content": "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;"}]}  # fmt: skip
    request = EngineRequest.model_validate(body)
    assert neutralise(request, ON) == (request, ())
    alone = EngineRequest.model_validate({"model": "w", "messages": [
        {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;"},
        {"role": "user", "content": "hi"}]})  # fmt: skip
    out, rules = neutralise(alone, ON)
    assert rules and out.messages is not None and [m.role for m in out.messages] == ["user"]  # empty: dropped


def test_the_session_key_comes_from_each_clients_own_field_hashed() -> None:
    assert session_key(SessionHints(), {}) is None
    claude = session_key(SessionHints(anthropic_user_id="user_abc_account__session_1"), {})
    assert claude == hash_key("metadata.user_id", "user_abc_account__session_1") and len(claude) == 32
    assert "user_abc" not in claude
    codex = session_key(SessionHints(), {"session_id": "0199-aa", "conversation_id": "0199-bb"})
    assert codex == hash_key("session_id", "0199-aa")
    assert session_key(SessionHints(), {"conversation_id": "0199-bb"}) == hash_key("conversation_id", "0199-bb")
    assert session_key(SessionHints(user="u1"), {}) == hash_key("user", "u1")
    cache_key = SessionHints(prompt_cache_key="k", user="u1", previous_response_id="resp_1")
    assert session_key(cache_key, {"session_id": "s"}) == hash_key("prompt_cache_key", "k")  # the client's own first


def test_a_responses_chain_keeps_its_first_turns_key() -> None:
    chains = ResponseChains(max_entries=2)
    first = session_key(SessionHints(previous_response_id="resp_0"), {}, chains)
    assert first == hash_key("previous_response_id", "resp_0")
    chains.remember("resp_1", first)
    assert session_key(SessionHints(previous_response_id="resp_1"), {}, chains) == first
    chains.remember("resp_2", first)
    chains.remember("resp_3", first)  # resp_1 is the least recently used of three: forgotten
    assert chains.get("resp_1") is None and chains.get("resp_3") == first


def test_the_worker_reads_the_key_into_its_generation_request() -> None:
    raw = json.dumps({"model": "w", "messages": USER, "session_key": "ab" * 16}).encode()
    request = EngineRequest.model_validate_json(raw)  # the worker's parse (chat_server._validate)
    assert request.session_key == "ab" * 16
    generation = GenerationRequest("r", (1, 2), SamplingParams(), session_key=request.session_key)
    assert generation.session_key == "ab" * 16
    with pytest.raises(ValueError, match="session_key"):
        EngineRequest.model_validate({"model": "w", "messages": USER, "session_key": "x" * 65})


@pytest.mark.parametrize("switch", [True, False])
async def test_the_service_sends_the_key_and_the_neutralised_prompt_and_counts_the_rule(switch: bool) -> None:
    h = Harness()
    h.service.prompt_cache = PromptCacheSettings(claude_code_billing_header=switch, session_key=switch)
    chat = to_chat(MessagesRequest.model_validate({**claude_request(), "model": "smol", "stream": False}))
    ctx = RequestContext(request_id="r", principal=OPEN, started=0.0, api="messages",
                         session_key=hash_key("metadata.user_id", "u"))  # fmt: skip
    await h.service.handle(chat, _request(), ctx)
    sent = h.engine.received[-1]
    assert sent.messages is not None and sent.messages[0].content is not None
    assert sent.messages[0].content.startswith("x-anthropic-billing-header") is not switch
    assert (sent.session_key == hash_key("metadata.user_id", "u")) is switch
    counted = h.metrics.registry.get_sample_value(
        "voltgate:prompt_neutralised_total", {"model": "smol", "rule": "claude_code_billing_header"}
    )
    assert counted == (1.0 if switch else None)


def test_the_switches_are_config_keys_and_unknown_ones_are_refused() -> None:
    base = {"models": [{"name": "m", "sources": [{"gguf": "/m.gguf"}]}]}
    cfg = Config.model_validate({**base, "prompt_cache": {"claude_code_billing_header": False}})
    assert not cfg.prompt_cache.claude_code_billing_header and cfg.prompt_cache.session_key
    with pytest.raises(ValueError, match="extra"):
        Config.model_validate({**base, "prompt_cache": {"codex_date": False}})


def _cache_samples(h: Harness) -> tuple[float | None, float | None, float | None]:
    value = h.metrics.registry.get_sample_value
    return (value("voltgate:prompt_tokens_cached_total", {"model": "smol"}),
            value("voltgate:prompt_tokens_cache_reported_total", {"model": "smol"}),
            value("voltgate:prefill_seconds_saved_total", {"model": "smol"}))  # fmt: skip


async def test_a_measured_cache_hit_is_relayed_and_counted_per_model() -> None:
    h = Harness()
    h.engine.behaviour = Behaviour(cached_tokens=3)
    unary = await h.call({"model": "smol", "messages": USER})
    assert isinstance(unary, UnaryResult) and unary.body is not None
    assert unary.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    stream = await h.call(
        {"model": "smol", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert isinstance(stream, StreamSession)
    assert b'"prompt_tokens_details": {"cached_tokens": 3}' in b"".join(await _drain(stream))  # as the worker sent it
    assert _cache_samples(h) == (6.0, 8.0, 0.0)  # no measured prefill speed and no prediction: no seconds yet


async def test_lmdeploys_cached_tokens_are_relayed_and_counted_with_its_metrics_on() -> None:
    """TurboMind counts its prefix-cache hits with its metrics on, LMDeploy 0.18's default (docs/api.md)."""
    h = Harness(engine=EngineName.LMDEPLOY)
    h.engine.behaviour = Behaviour(cached_tokens=3)
    unary = await h.call({"model": "smol", "messages": USER})
    assert isinstance(unary, UnaryResult) and unary.body is not None
    assert unary.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    assert _cache_samples(h)[:2] == (3.0, 4.0)


@pytest.mark.parametrize("said", [0, None])
async def test_lmdeploys_unmeasured_cached_tokens_never_reach_a_client_or_a_metric(said: int | None) -> None:
    """With `--disable-metrics` LMDeploy's api_server says `cached_tokens: 0` whatever its prefix cache reused
    (docs/api.md)."""
    h = Harness(engine=EngineName.LMDEPLOY, lmdeploy=LMDeployOptions(extra_args=(DISABLE_METRICS,)))
    h.engine.behaviour = Behaviour(cached_tokens=said)
    unary = await h.call({"model": "smol", "messages": USER})
    assert isinstance(unary, UnaryResult) and unary.body is not None
    assert "prompt_tokens_details" not in unary.body["usage"] and unary.body["usage"]["prompt_tokens"] == 4
    stream = await h.call(
        {"model": "smol", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert isinstance(stream, StreamSession)
    relayed = b"".join(await _drain(stream))
    assert b'"prompt_tokens"' in relayed and b"prompt_tokens_details" not in relayed
    req = MessagesRequest.model_validate({"model": "smol", "max_tokens": 8, "messages": USER})
    ctx = RequestContext(request_id="m", principal=OPEN, started=0.0, api="messages")
    answer = await h.service.handle(to_chat(req), _request(), ctx, lambda chat: to_message(chat, req, message_id="m"))
    assert isinstance(answer, UnaryResult) and answer.body is not None
    assert answer.body["usage"] == {"input_tokens": 4, "output_tokens": 2, "cache_creation_input_tokens": 0}
    assert _cache_samples(h) == (None, None, None)
