"""The routes' stream composition over a session's chat chunks: the translated events, mid-stream errors as each
API reports them, and a streamed Response stored before its last event is sent."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from gateway.errors import GatewayError
from gateway.ops.store import ResponseStore
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.responses import ChatCompletionChunk
from gateway.protocol.responses_api import ResponsesRequest
from gateway.routes.responses import _Turn
from gateway.serving.relay import StreamFailure
from gateway.translate import MessagesStream
from gateway.translate.chunk_loop import translated_events


def message_events(req: MessagesRequest, session: FakeSession) -> Any:
    return translated_events(session, MessagesStream(req, message_id="msg_1"))


class FakeSession:
    """Stands for `gateway.serving.session.StreamSession`: `chunks()` yields the chat chunks it was given, typed as the
    session yields them (an error frame's body as a `StreamFailure`; SSE comment frames as bytes);
    `translation_failed` records what the translation gave up with."""

    def __init__(self, chunks: list[dict[str, Any] | bytes]) -> None:
        self._chunks = chunks
        self.closed = False
        self.failed: list[GatewayError] = []

    async def chunks(self) -> AsyncGenerator[ChatCompletionChunk | StreamFailure | bytes, None]:
        try:
            for chunk in self._chunks:
                if isinstance(chunk, bytes):
                    yield chunk
                elif "error" in chunk:
                    yield StreamFailure.from_frame(json.dumps(chunk).encode())
                else:
                    yield ChatCompletionChunk.model_validate(chunk)
        finally:
            self.closed = True

    def translation_failed(self, exc: GatewayError) -> None:
        self.failed.append(exc)


def delta(**fields: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": fields}]}


def finish(reason: str) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


USAGE = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                                                  "total_tokens": 7}}  # fmt: skip
BROKEN = {"error": {"message": "the worker restarted", "type": "server_error", "code": "worker_unavailable"}}


def parse(frames: list[bytes]) -> list[dict[str, Any]]:
    events = []
    for frame in b"".join(frames).split(b"\n\n"):
        if frame and not frame.startswith(b":"):  # an SSE comment is no event
            name, data = frame.split(b"\n")
            event = json.loads(data.removeprefix(b"data: "))
            assert name == b"event: " + event["type"].encode()
            events.append(event)
    return events


def turn(db: ResponseStore, **body: Any) -> _Turn:
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", "stream": True, **body})
    return _Turn(req, db, "owner", "resp_1", 1_000)


async def test_a_streamed_response_is_stored_before_its_last_event(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    session = FakeSession([delta(role="assistant", content=""), delta(content="Hi"), finish("stop"), USAGE])
    frames: list[bytes] = []
    async for frame in turn(store).events(session):  # type: ignore[arg-type]
        if b"response.completed" in frame:
            assert (await store.get("resp_1", "owner"))["status"] == "completed"
        frames.append(frame)
    events = parse(frames)
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["usage"]["input_tokens"] == 5
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert (await store.input_items("resp_1", "owner"))[0]["id"].startswith("msg_")
    assert session.closed
    store.close()


async def test_a_chat_error_mid_stream_fails_the_response(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    session = FakeSession([delta(content="Hi"), BROKEN, delta(content="never read")])
    events = parse([frame async for frame in turn(store).events(session)])  # type: ignore[arg-type]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["message"] == "the worker restarted"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    assert (await store.get("resp_1", "owner"))["status"] == "failed"
    assert session.closed
    store.close()


async def test_interleaved_tool_call_fragments_fail_the_response(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    call = {"type": "function", "function": {"name": "f", "arguments": ""}}
    session = FakeSession([
        delta(tool_calls=[{"index": 0, "id": "call_a", **call}]),
        delta(tool_calls=[{"index": 1, "id": "call_b", **call}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]),
    ])  # fmt: skip
    events = parse([frame async for frame in turn(store, store=False).events(session)])  # type: ignore[arg-type]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert "cannot be streamed in order" in events[-2]["message"]
    assert [e.status for e in session.failed] == [502]  # accounted as the failure it was, not as 200
    assert not (tmp_path / "responses.sqlite3").exists()  # store: false writes nothing
    store.close()


async def test_a_chat_error_mid_stream_is_an_anthropic_error_event() -> None:
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "stream": True, "messages": [
        {"role": "user", "content": "hi"}]})  # fmt: skip
    session = FakeSession([delta(content="Hi"), BROKEN])
    events = parse([frame async for frame in message_events(req, session)])  # type: ignore[arg-type]
    assert [e["type"] for e in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "error",
    ]  # fmt: skip
    assert events[-1]["error"] == {"type": "overloaded_error", "message": "the worker restarted"}
    assert session.closed


async def test_comments_said_while_waiting_pass_through_both_apis_with_an_event_clients_count(tmp_path: Path) -> None:
    """The comment says what the stream waits for (curl users read it); the event after it (`ping`,
    `keepalive`) is what resets an SDK's or an agent's idle timer (issue 22)."""
    waiting = b": waiting for a free slot\n\n"
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "stream": True, "messages": [
        {"role": "user", "content": "hi"}]})  # fmt: skip
    chunks: list[dict[str, Any] | bytes] = [waiting, delta(content="Hi"), finish("stop"), USAGE]
    messages_frames = [frame async for frame in message_events(req, FakeSession(chunks))]  # type: ignore[arg-type]
    store = ResponseStore(tmp_path)
    responses_frames = [frame async for frame in turn(store, store=False).events(FakeSession(chunks))]  # type: ignore[arg-type]
    store.close()
    # Messages sends nothing before it waits (its message_start waits for the first chunk's prompt usage);
    # Responses sends response.created at once.
    for frames, keepalive, before in ((messages_frames, "ping", 0), (responses_frames, "keepalive", 1)):
        waited = next(i for i, frame in enumerate(frames) if frame.startswith(waiting))
        assert waited == before
        assert [e["type"] for e in parse([frames[waited]])] == [keepalive]
        assert parse(frames)[-1]["type"] in ("message_stop", "response.completed")
    assert [e["type"] for e in parse(messages_frames)][:3] == ["ping", "message_start", "ping"]


async def test_a_completed_message_stream_ends_with_its_usage() -> None:
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "stream": True, "messages": [
        {"role": "user", "content": "hi"}]})  # fmt: skip
    session = FakeSession([delta(content="Hi"), finish("length"), USAGE])
    events = parse([frame async for frame in message_events(req, session)])  # type: ignore[arg-type]
    assert [e["type"] for e in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"] == {
        "output_tokens": 2,
        "input_tokens": 5,
        "cache_creation_input_tokens": 0,  # no cache_read_input_tokens: the usage says nothing of a cache
    }
