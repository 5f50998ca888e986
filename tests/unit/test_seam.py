"""The seam between the gateway and its engines (issue 27): every request kind crosses it once and typed,
through the adapter, and one `Upstream` per deployment makes the HTTP call and maps what went wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.base import DeploymentPlan, EngineCapabilities, EngineName, RequestKind
from backends.llamacpp import LlamaCppAdapter
from backends.lmdeploy import LMDeployAdapter
from backends.remote import RemoteAdapter
from backends.request import ENGINE_PATHS, AnyEngineRequest, EngineEmbeddingRequest, missing_tool
from gateway.admission import Admission
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment
from gateway.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.rerank import RerankRequest
from gateway.protocol.served import ServedRequest
from gateway.serving.upstream import Upstream
from gateway.translate.messages import to_chat
from tests.fakes.asgi_worker import FakeWorker

REQUESTS: list[ServedRequest] = [
    ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    CompletionRequest.model_validate({"model": "m", "prompt": "hi", "stream": True}),
    EmbeddingRequest.model_validate({"model": "m", "input": ["a", "b"]}),
    RerankRequest.model_validate({"model": "m", "query": "q", "documents": ["a"]}),
]


@pytest.mark.parametrize("parsed", REQUESTS, ids=lambda r: r.kind.value)
def test_every_request_type_builds_the_engine_request_of_its_kind(parsed: ServedRequest) -> None:
    engine = parsed.to_engine(EngineTarget(model="worker-name"))
    assert engine.kind is parsed.kind and engine.model == "worker-name" and engine.kind in ENGINE_PATHS


@pytest.mark.parametrize("adapter", [LlamaCppAdapter(), LMDeployAdapter(), RemoteAdapter()], ids=lambda a: a.engine)
@pytest.mark.parametrize("parsed", REQUESTS, ids=lambda r: r.kind.value)
def test_every_adapter_translates_every_kind(adapter: Any, parsed: ServedRequest) -> None:
    body = adapter.translate_request(parsed.to_engine(EngineTarget(model="w")))
    assert body["model"] == "w"


def test_a_messages_stream_asks_for_the_prompt_usage_and_only_our_worker_is_sent_it() -> None:
    """The Messages API's chat request asks its engine for the prompt's usage in the first chunk (for
    message_start); a remote endpoint never sees voltgate's option, LMDeploy gets its own stream_options."""
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    engine = to_chat(MessagesRequest.model_validate(body)).to_engine(EngineTarget(model="w"))
    assert engine.include_prompt_usage and engine.include_usage
    unary = {**body, "stream": False}
    assert not to_chat(MessagesRequest.model_validate(unary)).to_engine(EngineTarget(model="w")).stream_options
    assert LlamaCppAdapter().translate_request(engine)["stream_options"] == {
        "include_usage": True, "include_prompt_usage": True}  # fmt: skip
    assert RemoteAdapter().translate_request(engine)["stream_options"] == {"include_usage": True}
    assert LMDeployAdapter().translate_request(engine)["stream_options"] == {"include_usage": True}
    chat_body = {**body, "stream_options": {"include_usage": True}}
    chat = ChatCompletionRequest.model_validate(chat_body).to_engine(EngineTarget(model="w"))
    assert LlamaCppAdapter().translate_request(chat)["stream_options"] == {"include_usage": True}  # chat: unchanged


@pytest.mark.parametrize("parsed", REQUESTS, ids=lambda r: r.kind.value)
def test_a_kind_the_engine_does_not_serve_is_refused_naming_model(parsed: ServedRequest) -> None:
    caps = EngineCapabilities(kinds=frozenset(set(RequestKind) - {parsed.kind}))
    with pytest.raises(GatewayError) as info:
        parsed.check(caps, "model 'm' (test)")
    assert info.value.param == "model" and ENGINE_PATHS[parsed.kind] in info.value.message


def test_the_named_tool_check_is_one_function() -> None:
    assert missing_tool("f", {"f"}) is None
    assert missing_tool("g", {"f"}) == "tool_choice names 'g', which is not in tools"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}}  # fmt: skip
    with pytest.raises(GatewayError) as info:
        ChatCompletionRequest.model_validate(body).to_engine(EngineTarget(model="w"))
    assert info.value.param == "tool_choice" and "which is not in tools" in info.value.message


def _upstream(handler: Any) -> Upstream:
    plan = DeploymentPlan(model="w", engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"), model_format="gguf",
                          context_tokens=64, task="embed")  # fmt: skip
    worker = FakeWorker("m")
    worker.start()
    deployment = Deployment("m", (), plan, LlamaCppAdapter(), worker, Admission("m", 1, 1, queue_timeout_s=1))
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return Upstream(deployment, client, httpx.Timeout(5.0))


EMBED: AnyEngineRequest = EngineEmbeddingRequest(model="w", input="a")


async def test_the_upstream_posts_each_kind_to_its_path_and_returns_the_answer() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"object": "list", "data": []})

    assert (await _upstream(handler).post(EMBED))["object"] == "list"
    assert seen == ["/v1/embeddings"]


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (400, {"error": {"message": "too long", "code": "context_length_exceeded"}}, ErrorCode.CONTEXT_LENGTH_EXCEEDED),
        (400, {"error": {"message": "bad", "param": "input"}}, ErrorCode.INVALID_REQUEST),
        (429, {"error": {"message": "busy"}}, ErrorCode.QUEUE_FULL),
        (503, {"error": {"message": "loading"}}, ErrorCode.WORKER_UNAVAILABLE),
        (500, {"error": {"message": "boom"}}, ErrorCode.UPSTREAM_ERROR),
    ],
)
async def test_the_upstream_maps_worker_errors_for_unary_and_stream_alike(
    status: int, body: dict[str, Any], code: ErrorCode
) -> None:
    upstream = _upstream(lambda _request: httpx.Response(status, json=body))
    for call in (upstream.post, upstream.open_stream):
        with pytest.raises(GatewayError) as info:
            await call(EMBED)
        assert info.value.code is code


async def test_a_lost_connection_and_a_body_that_is_not_json_are_the_gateways_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(GatewayError) as info:
        await _upstream(refuse).post(EMBED)
    assert info.value.code is ErrorCode.WORKER_UNAVAILABLE
    with pytest.raises(GatewayError) as info:
        await _upstream(lambda _request: httpx.Response(200, content=b"nope")).post(EMBED)
    assert info.value.code is ErrorCode.UPSTREAM_ERROR
