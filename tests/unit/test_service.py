"""The service layer in-process, through the `Worker` interface, against an ASGI fake engine (no sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from backends.base import DeploymentPlan, EngineName, LMDeployOptions
from backends.llamacpp import LlamaCppAdapter
from backends.lmdeploy import LMDeployAdapter
from gateway.admission import Admission
from gateway.config import ServerSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.ops.auth import OPEN
from gateway.ops.metrics import Metrics
from gateway.protocol import ChatCompletion, ChatCompletionRequest, parse_request
from gateway.protocol.anthropic import MessagesRequest
from gateway.serving.relay import StreamStats, _relay_run
from gateway.serving.service import RequestContext, Service, StreamSession, Translate, UnaryResult
from gateway.serving.session import RequestScope
from gateway.translate import messages
from gateway.translate.messages import to_message
from tests.fakes.asgi_worker import Behaviour, FakeEngine, FakeWorker

USER = [{"role": "user", "content": "hi"}]


class Harness:
    def __init__(
        self,
        *,
        capacity: int = 2,
        max_queue: int = 4,
        engine: EngineName = EngineName.LLAMACPP,
        lmdeploy: LMDeployOptions = LMDeployOptions(),  # noqa: B008 (frozen)
    ) -> None:
        self.engine = FakeEngine()
        self.metrics = Metrics(gpu=False)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.engine.app()))
        plan = DeploymentPlan(model="smol-worker", engine=engine, source_path=Path("/m.gguf"), model_format="gguf",
                              context_tokens=1024, slots=capacity, lmdeploy=lmdeploy)  # fmt: skip
        adapter = LlamaCppAdapter() if engine is EngineName.LLAMACPP else LMDeployAdapter()
        self.worker = FakeWorker("smol")
        self.worker.start()
        admission = Admission("smol", capacity, max_queue, queue_timeout_s=5)
        registry = Registry()
        registry.add(Deployment("smol", ("smol-alias",), plan, adapter, self.worker, admission, default_max_tokens=32))
        settings = ServerSettings(keepalive_interval_s=0.05)
        self.service = Service(registry, self.client, settings, self.metrics)
        self.admission = admission

    def count(self, status: int, model: str = "smol") -> float:
        labels = {"model": model, "endpoint": "chat", "status": str(status)}
        return self.metrics.registry.get_sample_value("voltgate:requests_total", labels) or 0.0

    async def call(self, body: dict[str, object], translate: Translate | None = None) -> UnaryResult | StreamSession:
        return await self.handle(parse_request(json.dumps(body).encode(), ChatCompletionRequest), translate)

    async def handle(
        self, parsed: ChatCompletionRequest, translate: Translate | None = None
    ) -> UnaryResult | StreamSession:
        ctx = RequestContext(request_id="req-1", principal=OPEN, started=0.0)
        return await self.service.handle(parsed, _request(), ctx, translate=translate)


def _request() -> Request:
    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()  # the client never goes away
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def _drain(session: StreamSession) -> list[bytes]:
    frames: AsyncIterator[bytes] = session.frames()
    return [frame async for frame in frames]


async def test_unary_chat_reaches_the_engine_as_one_typed_request_and_is_accounted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    caplog.set_level(logging.INFO, logger="voltgate.access")
    body = {"model": "smol-alias", "messages": [{"role": "developer", "content": "be brief"}, *USER]}
    result = await h.call(body)
    assert isinstance(result, UnaryResult) and result.body is not None
    assert result.body["choices"][0]["message"]["content"] == "Hello there"
    sent = h.engine.received[0]
    assert sent.model == "smol-worker"
    assert [m.role for m in sent.messages or ()] == ["system", "user"]
    assert sent.max_tokens == 32  # the deployment's default_max_tokens
    assert h.count(200) == 1
    assert h.admission.running == 0
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.access"]
    assert [(line["status"], line["model"]) for line in lines] == [(200, "smol")]


async def test_stream_relays_frames_ends_with_done_and_drops_usage_not_asked_for() -> None:
    h = Harness()
    session = await h.call({"model": "smol", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)
    frames = b"".join(await _drain(session))
    assert frames.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' not in frames
    assert h.engine.received[0].include_usage  # the engine is always asked, for exact token metrics
    assert h.count(200) == 1
    assert h.admission.running == 0
    tokens = h.metrics.registry.get_sample_value("voltgate:generation_tokens_total", {"model": "smol"})
    assert tokens == 3


async def test_a_stream_closed_before_it_is_read_releases_its_slot_once() -> None:
    h = Harness(capacity=1)
    session = await h.call({"model": "smol", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)
    assert h.admission.running == 1
    await session.close()
    await session.close()
    assert h.admission.running == 0
    assert h.count(499) == 1


async def test_a_queued_stream_gets_keepalives_then_its_answer() -> None:
    h = Harness(capacity=1)
    h.engine.behaviour = Behaviour(delay_s=0.1)
    first = await h.call({"model": "smol", "messages": USER, "stream": True})
    second = await h.call({"model": "smol", "messages": USER, "stream": True})
    assert isinstance(first, StreamSession) and isinstance(second, StreamSession)
    drained = asyncio.ensure_future(_drain(second))
    await _drain(first)
    frames = b"".join(await drained)
    assert frames.startswith(b": waiting for a free slot")
    assert frames.endswith(b"data: [DONE]\n\n")
    assert h.count(200) == 2


def _cannot_render(_chat: ChatCompletion) -> dict[str, object]:
    raise GatewayError(ErrorCode.UPSTREAM_ERROR, "the model's arguments for tool 'f' are not a JSON object")


async def test_a_translation_that_cannot_render_the_answer_is_accounted_with_its_error_not_200() -> None:
    h = Harness()
    rendered = await h.call({"model": "smol", "messages": USER}, translate=lambda chat: {"wrapped": chat.id})
    assert isinstance(rendered, UnaryResult) and set(rendered.body or {}) == {"wrapped"}
    with pytest.raises(GatewayError) as info:
        await h.call({"model": "smol", "messages": USER}, translate=_cannot_render)
    assert info.value.status == 502
    assert (h.count(200), h.count(502)) == (1, 1)
    assert h.admission.running == 0


@pytest.mark.parametrize(
    ("choice", "stop"),
    [
        ({"stop_reason": "END"}, ("stop_sequence", "END")),  # vLLM: the stop string it matched
        ({"matched_stop": "END"}, ("stop_sequence", "END")),  # SGLang
        ({"stop_reason": "OTHER"}, ("end_turn", None)),  # not one of the request's stop_sequences
        ({"stop_reason": 2}, ("end_turn", None)),  # vLLM: a stop token's id
        ({}, ("end_turn", None)),  # our llama.cpp worker: it does not name the stop string it matched
    ],
    ids=["vllm", "sglang", "other-string", "token-id", "llamacpp-worker"],
)
async def test_a_non_streamed_message_reports_the_stop_sequence_its_upstream_matched(
    choice: dict[str, object], stop: tuple[str, str | None]
) -> None:
    """The worker's answer is read once into the typed `ChatCompletion`, which keeps the peer's matched stop
    for the Messages API; the chat pass-through of the same answer renders OpenAI's fields only, as before."""
    h = Harness()
    h.engine.behaviour = Behaviour(choice=choice)
    req = MessagesRequest.model_validate(
        {"model": "smol", "max_tokens": 8, "messages": USER, "stop_sequences": ["END", "\n\nHuman:"]}
    )
    seen: list[ChatCompletion] = []

    def render(chat: ChatCompletion) -> dict[str, Any]:
        seen.append(chat)
        return to_message(chat, req, message_id="msg_1")

    message = await h.handle(messages.to_chat(req), render)
    assert isinstance(message, UnaryResult) and message.body is not None
    assert (message.body["stop_reason"], message.body["stop_sequence"]) == stop
    assert [type(chat) for chat in seen] == [ChatCompletion]
    chat = await h.call({"model": "smol", "messages": USER})
    assert isinstance(chat, UnaryResult) and chat.body is not None
    assert list(chat.body["choices"][0]) == ["index", "message", "logprobs", "finish_reason"]


async def test_a_stream_its_translation_gave_up_on_is_accounted_with_that_error() -> None:
    h = Harness()
    session = await h.call({"model": "smol", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)
    async with contextlib.aclosing(session.chunks()) as chunks:
        async for _chunk in chunks:
            session.translation_failed(GatewayError(ErrorCode.UPSTREAM_ERROR, "cannot be streamed in order"))
            break
    await session.close()
    assert (h.count(200), h.count(502)) == (0, 1)
    assert h.admission.running == 0


async def test_a_failed_worker_is_a_503_and_the_refusal_is_counted() -> None:
    h = Harness()
    h.worker.fail()
    with pytest.raises(GatewayError) as info:
        await h.call({"model": "smol", "messages": USER})
    assert info.value.status == 503
    assert h.count(503) == 1
    assert not h.engine.received


async def test_an_engine_400_keeps_its_param_and_is_counted() -> None:
    h = Harness()
    h.engine.behaviour = Behaviour(status=400, error={"error": {"message": "bad", "param": "messages", "code": None}})
    with pytest.raises(GatewayError) as info:
        await h.call({"model": "smol", "messages": USER})
    assert (info.value.status, info.value.param) == (400, "messages")
    assert h.count(400) == 1
    assert h.admission.running == 0


async def test_an_unknown_model_is_counted_under_a_bounded_label() -> None:
    h = Harness()
    with pytest.raises(GatewayError) as info:
        await h.call({"model": "nope", "messages": USER})
    assert info.value.status == 404
    assert h.count(404, model="unknown") == 1


async def test_a_full_queue_is_429_without_disturbing_the_request_in_flight() -> None:
    h = Harness(capacity=1, max_queue=0)
    first = await h.call({"model": "smol", "messages": USER, "stream": True})
    with pytest.raises(GatewayError) as info:
        await h.call({"model": "smol", "messages": USER, "stream": True})
    assert info.value.status == 429
    assert isinstance(first, StreamSession)
    assert b"".join(await _drain(first)).endswith(b"data: [DONE]\n\n")
    assert h.count(429) == 1 and h.count(200) == 1


async def test_tools_to_an_engine_without_a_tool_parser_are_refused_by_name() -> None:
    h = Harness(engine=EngineName.LMDEPLOY)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(GatewayError) as info:
        await h.call({"model": "smol", "messages": USER, "tools": tools})
    assert (info.value.status, info.value.param) == (400, "tools")
    assert h.count(400) == 1


async def test_streamed_and_unary_requests_feed_the_models_measured_speed() -> None:
    h = Harness()
    session = await h.call({"model": "smol", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)
    await _drain(session)
    assert isinstance(await h.call({"model": "smol", "messages": USER}), UnaryResult)
    h.engine.behaviour = Behaviour(status=400, error={"error": {"message": "bad", "code": None}})
    with pytest.raises(GatewayError):
        await h.call({"model": "smol", "messages": USER})
    stream, unary = h.metrics.live.samples("smol")  # the refused request is no sample
    assert stream.streamed and stream.alone and stream.prompt_tokens == 4 and stream.ttft_s is not None
    assert not unary.streamed and unary.alone and unary.decode_tok_s is None and unary.ttft_s is None
    assert unary.unary_tok_s is not None and unary.unary_tok_s > 0
    assert h.metrics.live.summary("smol")["window_requests"] == 2


def test_a_streams_ttft_and_decode_speed_start_at_its_first_generated_token() -> None:
    """The relay's times (ASGITransport buffers a body, so they are set here): the role-only chunk at 10 ms,
    the first content at 500 ms, the last chunk at 1.5 s."""
    h = Harness()
    t0 = time.monotonic()
    ctx = RequestContext(request_id="req-1", principal=OPEN, started=t0)
    scope = RequestScope(h.service.registry.resolve("smol"), ctx, h.metrics)
    assert scope.try_admit()
    stats = StreamStats(first_token_at=t0 + 0.01, first_content_at=t0 + 0.5, last_chunk_at=t0 + 1.5, completed=True)
    scope.finish(200, (4, 11), stats)
    ttft = h.metrics.registry.get_sample_value("voltgate:time_to_first_token_seconds_sum", {"model": "smol"})
    assert ttft == pytest.approx(0.5)
    (sample,) = h.metrics.live.samples("smol")
    assert sample.decode_tok_s == pytest.approx(10 / 1.0)  # 10 tokens after the first in 1 s
    assert sample.ttft_s == pytest.approx(0.5, abs=0.05)  # from its admission, just after t0


async def test_a_stream_the_client_leaves_is_a_499_whose_access_line_counts_its_chunks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    caplog.set_level(logging.INFO, logger="voltgate.access")
    session = await h.call({"model": "smol", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)

    def frame(delta: dict[str, object]) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode()

    # What the relay saw before the client left: the role chunk, then five content chunks (two in one read).
    runs = [frame({"role": "assistant", "content": ""}) + b"\n\n", *(frame({"content": f"t{i}"}) + b"\n\n"
            for i in range(3)), (frame({"content": "t3"}) + b"\n\n") * 2]  # fmt: skip
    for run in runs:
        _relay_run(run, session.stats, include_usage=False)
    await session.close()
    assert h.count(499) == 1
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.access"]
    assert [line["status"] for line in lines] == [499]
    assert lines[0]["completion_tokens"] == 5 and lines[0]["tokens_from"] == "chunks"
    assert lines[0]["prompt_tokens"] is None  # unknown: the usage frame never came
    assert h.metrics.registry.get_sample_value("voltgate:generation_tokens_total", {"model": "smol"}) == 5
