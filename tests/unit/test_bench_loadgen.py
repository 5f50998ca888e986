"""The load generator's SSE parsing and request records, against the zero upstream over ASGI (no sockets)."""

from __future__ import annotations

import httpx
import pytest

from bench import relay_floor, zero_upstream
from bench.loadgen import DONE, LoadSpec, chunk_text, make_prompt, parse_sse_line, run_level, send_one


def test_parse_sse_line_handles_data_done_comments_and_garbage():
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert parse_sse_line("data: [DONE]") is DONE
    assert parse_sse_line(": keep-alive") is None
    assert parse_sse_line("") is None
    assert "error" in parse_sse_line("data: {not json")


def test_chunk_text_reads_chat_deltas_and_completion_text():
    assert chunk_text({"choices": [{"delta": {"content": "hi"}}]}) == "hi"
    assert chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert chunk_text({"choices": [{"text": " yo"}]}) == " yo"
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""


def test_prompts_are_deterministic_and_distinct_from_the_first_word():
    assert make_prompt(32, 7) == make_prompt(32, 7)
    assert len(make_prompt(32, 7).split()) == 32
    firsts = {make_prompt(4, seed).split()[0] for seed in range(50)}
    assert len(firsts) > 10


def test_payload_asks_for_fixed_length_streams_with_usage():
    spec = LoadSpec(base_url="http://x/v1", model="m", endpoint="chat", output_tokens=7, api_key="secret")
    body = spec.payload(3)
    assert body["max_tokens"] == 7
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["role"] == "user"
    assert spec.url == "http://x/v1/chat/completions"
    assert spec.headers() == {"Authorization": "Bearer secret"}
    assert "secret" not in str(spec.describe())


def test_sampled_lengths_stay_in_range_and_repeat_per_index():
    spec = LoadSpec(base_url="http://x/v1", model="m", prompt_tokens=100, output_tokens=50, range_ratio=0.5)
    lengths = [spec.lengths(i) for i in range(200)]
    assert all(50 <= p <= 150 and 25 <= o <= 75 for p, o in lengths)
    assert len(set(lengths)) > 50
    assert spec.lengths(7) == spec.lengths(7)
    assert spec.payload(7)["max_tokens"] == spec.lengths(7)[1]
    assert LoadSpec(base_url="http://x/v1", model="m").lengths(3) == (64, 64)


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_one_request_records_tokens_chunks_and_usage(endpoint):
    spec = LoadSpec(base_url="http://test/v1", model="zero", endpoint=endpoint, output_tokens=5)
    async with _client(zero_upstream.create_app()) as client:
        rec = await send_one(client, spec, 0, 0.0)
    assert rec.ok, rec.error
    assert rec.status == 200
    assert rec.output_tokens == 5
    assert rec.content_chunks == 5
    assert rec.chunks == 6  # five tokens and the usage chunk
    assert len(rec.itl_s) == 4
    assert rec.prompt_tokens == 64
    assert rec.ttft_s is not None and rec.e2e_s >= rec.ttft_s


async def test_http_errors_are_recorded_not_raised():
    spec = LoadSpec(base_url="http://test/v1", model="zero", output_tokens=5, extra_body={"max_tokens": -1})
    async with _client(zero_upstream.create_app()) as client:
        rec = await send_one(client, spec, 0, 0.0)
    assert not rec.ok
    assert rec.error == "http_400"


async def test_a_level_through_the_floor_relay_completes_every_request():
    upstream = httpx.ASGITransport(app=zero_upstream.create_app())
    floor = relay_floor.create_app("http://upstream", transport=upstream)
    spec = LoadSpec(base_url="http://test/v1", model="zero", output_tokens=8)
    async with _client(floor) as client:
        level = await run_level(client, spec, num_requests=6, concurrency=3)
    s = level.summary
    assert s["completed"] == 6, s["errors"]
    assert s["output_tokens"] == 48
    assert [r.index for r in level.records] == list(range(6))


async def test_request_rate_mode_sends_every_request():
    spec = LoadSpec(base_url="http://test/v1", model="zero", output_tokens=2)
    async with _client(zero_upstream.create_app()) as client:
        level = await run_level(client, spec, num_requests=5, request_rate=1000.0, concurrency=2)
    assert level.summary["completed"] == 5
    assert level.request_rate == 1000.0
