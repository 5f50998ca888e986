"""The llama.cpp worker as a real process on the real SmolLM2 GGUF: batching, queueing, cancellation, wire format."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.openai_schema import assert_matches_openai
from tests.worker_process import MODEL, running_worker, start_worker, stop

pytestmark = pytest.mark.integration

SLOTS = 4
CTX = 1024
MAX_QUEUE = 16


@dataclass
class Worker:
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/health", timeout=5)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_idle(self, timeout_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            health = self.health()
            if health["slots_busy"] == 0 and health["queue_depth"] == 0:
                return health
            assert time.monotonic() < deadline, f"worker still busy: {health}"
            time.sleep(0.05)

    def wait_for_log(self, *needles: str, timeout_s: float = 10.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.log().splitlines():
                if all(n in line for n in needles):
                    return line
            assert time.monotonic() < deadline, f"no log line with {needles}:\n{self.log()[-2000:]}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def worker(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    log_path = tmp_path_factory.mktemp("llamacpp-worker") / "worker.log"
    # One thread: ggml's thread barriers crawl when other test processes share the (CI-sized) cores.
    args = ["--ctx", str(CTX), "--slots", str(SLOTS), "--max-queue", str(MAX_QUEUE), "--n-threads", "1"]
    with running_worker(smollm2_path, log_path, *args) as (process, url):
        yield Worker(url, log_path, process)


@pytest_asyncio.fixture(loop_scope="function")
async def client(worker: Worker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as c:
        yield c


def chat_body(content: str, **params: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **params}


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def run_case(client: httpx.AsyncClient, case: dict[str, Any]) -> tuple[str, str, int]:
    """(text, finish_reason, completion_tokens) of one chat or completion request."""
    if "prompt" in case:
        body = await post(client, "/v1/completions", {"model": MODEL, **case})
        choice = body["choices"][0]
        text = choice["text"]
    else:
        body = await post(client, "/v1/chat/completions", chat_body(**case))
        choice = body["choices"][0]
        text = choice["message"]["content"]
    return text, choice["finish_reason"], body["usage"]["completion_tokens"]


async def stream_events(response: httpx.Response) -> list[Any]:
    """Parse an SSE body into JSON objects, with the final "[DONE]" kept as a string."""
    events: list[Any] = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def streamed_text(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e["choices"]
    )


# --- wire format -------------------------------------------------------------------------------


async def test_health_and_models_describe_the_worker(worker: Worker, client: httpx.AsyncClient) -> None:
    health = worker.health()
    assert health["status"] == "ok"
    assert health["model"] == MODEL
    assert health["slots"] == SLOTS
    assert health["n_ctx_per_slot"] == CTX
    for key in (
        "slots_busy", "queue_depth", "kv_cells_used", "requests_total", "aborted_total",
        "prompt_tokens_total", "generation_tokens_total", "tokens_per_second",
    ):  # fmt: skip
        assert key in health
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [(MODEL, "model", "voltgate")]


async def test_chat_completion_is_a_valid_openai_response(client: httpx.AsyncClient) -> None:
    body = await post(client, "/v1/chat/completions", chat_body("Say hello.", temperature=0, max_tokens=12))
    completion = ChatCompletion.model_validate(body)
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == MODEL
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


async def test_text_completion_is_a_valid_openai_response(client: httpx.AsyncClient) -> None:
    body = await post(
        client, "/v1/completions", {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6}
    )
    completion = Completion.model_validate(body)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert completion.choices[0].finish_reason in ("stop", "length")


async def test_stream_sends_role_then_content_then_finish_usage_and_done(client: httpx.AsyncClient) -> None:
    body = chat_body("Count to five.", temperature=0, max_tokens=10, stream=True)
    body["stream_options"] = {"include_usage": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = await stream_events(response)
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    finish = chunks[-2]
    assert finish.choices[0].finish_reason == "length"
    assert finish.choices[0].delta.content is None
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])  # OpenAI's stream: usage only in the last chunk
    non_stream = await post(client, "/v1/chat/completions", chat_body("Count to five.", temperature=0, max_tokens=10))
    assert streamed_text(events) == non_stream["choices"][0]["message"]["content"]


async def test_a_stream_asked_for_prompt_usage_opens_with_the_prompts_counts(client: httpx.AsyncClient) -> None:
    """`stream_options.include_prompt_usage` (what the gateway asks for Anthropic's message_start): the first
    chunk carries the prompt's tokens and its cached part, 0 completion tokens; the last the whole usage."""
    options = {"include_usage": True, "include_prompt_usage": True}
    content = "Name three colours of the rainbow, please."
    openings = []
    for _ in range(2):  # the same prompt again: its prefix is cached
        body = chat_body(content, temperature=0, max_tokens=4, stream=True, n=2, stream_options=options)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            events = await stream_events(response)
        chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]
        first, final = chunks[0].usage, chunks[-1].usage
        assert first is not None and final is not None and chunks[-1].choices == []
        assert [(c.choices[0].index, c.choices[0].delta.role) for c in chunks[:2]] == [
            (0, "assistant"),
            (1, "assistant"),
        ]
        assert all(c.usage is None for c in chunks[1:-1])
        assert (first.prompt_tokens, first.completion_tokens, first.total_tokens) == (
            final.prompt_tokens,
            0,
            final.prompt_tokens,
        )
        assert first.prompt_tokens_details == final.prompt_tokens_details and final.completion_tokens == 8
        openings.append(first)
    assert openings[1].prompt_tokens_details is not None
    assert openings[1].prompt_tokens_details.cached_tokens == openings[1].prompt_tokens - 1  # all but the last
    text = {"model": MODEL, "prompt": "One, two,", "max_tokens": 3, "stream": True, "stream_options": options}
    async with client.stream("POST", "/v1/completions", json=text) as response:
        events = await stream_events(response)
    assert events[0]["choices"][0]["text"] == "" and events[0]["usage"]["completion_tokens"] == 0
    assert events[0]["usage"]["prompt_tokens"] == events[-2]["usage"]["prompt_tokens"] > 0


async def test_completion_stream_has_no_usage_chunk_unless_asked(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "One, two,", "max_tokens": 5, "temperature": 0, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        events = await stream_events(response)
    assert events[-1] == "[DONE]"
    objects = events[:-1]
    for e in objects:  # the SDK's Completion type has no nullable finish_reason, so check by hand
        assert (e["object"], e["model"], e["id"]) == ("text_completion", MODEL, objects[0]["id"])
        assert set(e["choices"][0]) == {"index", "text", "logprobs", "finish_reason"}
    assert [e["choices"][0]["finish_reason"] for e in objects[:-1]] == [None] * (len(objects) - 1)
    assert objects[-1]["choices"][0]["finish_reason"] == "length"


async def test_max_tokens_gives_length_and_exact_usage(client: httpx.AsyncClient) -> None:
    body = await post(
        client, "/v1/chat/completions", chat_body("Tell me a story.", max_tokens=5, ignore_eos=True, seed=1)
    )
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 5


# --- stop strings: cut from the text, named as vLLM names them (`stop_reason`) ---------------------


async def test_stop_string_is_not_returned_and_is_named(client: httpx.AsyncClient) -> None:
    prompt = {"model": MODEL, "prompt": "The days of the week are Monday,", "temperature": 0}
    full = (await post(client, "/v1/completions", {**prompt, "max_tokens": 24}))["choices"][0]["text"]
    words = full.split()
    assert len(words) >= 4, full
    stop = words[2]
    expected = full[: full.index(stop)]

    body = await post(client, "/v1/completions", {**prompt, "max_tokens": 24, "stop": [stop, "never-seen"]})
    Completion.model_validate(body)
    assert_matches_openai("CreateCompletionResponse", body)
    assert body["choices"][0]["text"] == expected
    assert (body["choices"][0]["finish_reason"], body["choices"][0]["stop_reason"]) == ("stop", stop)

    async with client.stream(
        "POST", "/v1/completions", json={**prompt, "max_tokens": 24, "stop": [stop], "stream": True}
    ) as response:
        events = await stream_events(response)
    pieces = [e["choices"][0]["text"] for e in events[:-1]]
    assert "".join(pieces) == expected  # a partial match is held back, never streamed and retracted
    assert (events[-2]["choices"][0]["finish_reason"], events[-2]["choices"][0]["stop_reason"]) == ("stop", stop)
    assert all("stop_reason" not in e["choices"][0] for e in events[:-2])  # only the finishing chunk names it


DAYS = "List the days of the week."


async def greedy_days(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    """The greedy chat answer to DAYS (24 tokens at most unless `params` say otherwise)."""
    return await post(client, "/v1/chat/completions", chat_body(DAYS, **{"temperature": 0, "max_tokens": 24, **params}))


async def test_a_chat_stop_string_the_greedy_answer_hits_is_named_whole_and_streamed(client: httpx.AsyncClient) -> None:
    full = (await greedy_days(client))["choices"][0]["message"]["content"]
    word = full.split()[2]
    stops = ["never-stop-here", word]
    body = await greedy_days(client, stop=stops)
    ChatCompletion.model_validate(body)
    assert_matches_openai("CreateChatCompletionResponse", body)
    cut = body["choices"][0]
    assert cut["message"]["content"] == full[: full.index(word)]
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", word)

    request = chat_body(DAYS, temperature=0, max_tokens=24, stop=stops, stream=True)
    async with client.stream("POST", "/v1/chat/completions", json=request) as response:
        events = await stream_events(response)
    assert events[-1] == "[DONE]"
    for event in events[:-1]:
        ChatCompletionChunk.model_validate(event)
        assert_matches_openai("CreateChatCompletionStreamResponse", event)
    assert streamed_text(events) == cut["message"]["content"]
    finishing = events[-2]["choices"][0]
    assert (finishing["finish_reason"], finishing["stop_reason"]) == ("stop", word)
    assert all("stop_reason" not in e["choices"][0] for e in events[:-2])


async def test_a_chat_no_stop_string_ended_names_none(client: httpx.AsyncClient) -> None:
    """EOS (a short answer, a stop string it never writes) and max_tokens: no `stop_reason`."""
    short = chat_body("What is 2+2? Answer with one number.", temperature=0, max_tokens=64, stop=["never-here"])
    body = await post(client, "/v1/chat/completions", short)
    assert body["choices"][0]["finish_reason"] == "stop" and "stop_reason" not in body["choices"][0]
    cut = await greedy_days(client, max_tokens=3, stop=["never-here"])
    assert cut["choices"][0]["finish_reason"] == "length" and "stop_reason" not in cut["choices"][0]


async def test_json_mode_returns_valid_json(client: httpx.AsyncClient) -> None:
    body = await post(
        client,
        "/v1/chat/completions",
        chat_body(
            "Give me a JSON object describing a cat with keys name and age.",
            response_format={"type": "json_object"},
            temperature=0,
            max_tokens=200,
        ),
    )
    text = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop", text
    assert isinstance(json.loads(text), dict)


async def test_multibyte_characters_are_never_split_across_chunks(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "日本の首都は東京です。中国の首都は", "temperature": 0, "max_tokens": 24}
    full = (await post(client, "/v1/completions", body))["choices"][0]["text"]
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        events = await stream_events(response)
    pieces = [e["choices"][0]["text"] for e in events[:-1]]
    assert "".join(pieces) == full
    assert "\ufffd" not in full
    assert any(ord(ch) > 0x2FFF for ch in full), f"expected CJK output, got {full!r}"


# --- errors ------------------------------------------------------------------------------------


async def test_prompt_longer_than_context_is_400_context_length_exceeded(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body("hello " * (CTX + 10), max_tokens=4))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages"

    response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello " * (CTX + 10)})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"


async def test_invalid_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == ("invalid_json", None)


async def test_bad_bodies_name_the_parameter_like_the_embed_worker(client: httpx.AsyncClient) -> None:
    """Both workers parse bodies through `httpkit.parse_body`: the same paths, messages and codes."""
    response = await client.post("/v1/chat/completions", content=b"[1]", headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["message"], error["code"]) == ("the request body must be a JSON object", "invalid_request_error")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}
    response = await client.post("/v1/chat/completions", json=body)
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (400, "messages[1].role"), error
    response = await client.post("/v1/completions", json=chat_body("hi"))
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["code"]) == (400, "prompt", "invalid_request_error")


def test_unloadable_model_exits_nonzero(tmp_path: Path) -> None:
    bogus = tmp_path / "broken.gguf"
    bogus.write_bytes(b"GGUF" + b"\0" * 64)
    log_path = tmp_path / "worker.log"
    process, _ = start_worker(bogus, log_path, "--ctx", "256", "--slots", "1")
    try:
        assert process.wait(30) != 0
    finally:
        if process.poll() is None:
            stop(process)
    assert "failed" in log_path.read_text()


# --- batching, queueing, cancellation -------------------------------------------------------------

CASES: list[dict[str, Any]] = [
    {"content": "Write a haiku about the sea.", "temperature": 0, "max_tokens": 24},
    {"content": "List three colors.", "temperature": 0.9, "seed": 7, "max_tokens": 20},
    {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 32},
    {"prompt": "The three laws of robotics are", "temperature": 1.0, "seed": 123, "top_p": 0.9, "max_tokens": 16},
    {"content": "Explain gravity to a child.", "temperature": 0.7, "seed": 42, "top_k": 40, "max_tokens": 28},
    {"content": "What is 2+2?", "temperature": 0, "max_tokens": 12, "frequency_penalty": 0.5},
    {"prompt": "def fibonacci(n):", "temperature": 0.5, "seed": 9, "min_p": 0.05, "max_tokens": 30},
    {"content": "Name a famous painter.", "temperature": 1.2, "seed": 2024, "presence_penalty": 0.3, "max_tokens": 18},
    # A prompt longer than one 64-row attention tile: llama.cpp picks different kernels by shape.
    {"content": "Summarise: " + "Rivers carry water from hills to the sea. " * 16, "temperature": 0.8, "seed": 11,
     "max_tokens": 16},
]  # fmt: skip


async def test_concurrent_requests_match_their_solo_outputs(worker: Worker, client: httpx.AsyncClient) -> None:
    solo = [await run_case(client, case) for case in CASES]
    together = await asyncio.gather(*(run_case(client, case) for case in CASES))
    assert list(together) == solo
    worker.wait_idle()


async def test_request_joining_midway_does_not_disturb_running_stream(
    worker: Worker, client: httpx.AsyncClient
) -> None:
    long = chat_body("Tell me a long story about a lighthouse keeper.", temperature=0, max_tokens=48, ignore_eos=True)
    joiner = chat_body("Summarise this: " + "the cat sat on the mat. " * 30, temperature=0, max_tokens=6)
    long_solo = (await post(client, "/v1/chat/completions", long))["choices"][0]["message"]["content"]
    joiner_solo = (await post(client, "/v1/chat/completions", joiner))["choices"][0]["message"]["content"]

    pieces: list[str] = []
    joiner_task: asyncio.Task[dict[str, Any]] | None = None
    pieces_when_joiner_done: int | None = None
    async with client.stream("POST", "/v1/chat/completions", json={**long, "stream": True}) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: ") :])
            pieces.append(event["choices"][0]["delta"].get("content") or "")
            if len(pieces) == 6:
                joiner_task = asyncio.create_task(post(client, "/v1/chat/completions", joiner))
            if joiner_task is not None and joiner_task.done() and pieces_when_joiner_done is None:
                pieces_when_joiner_done = len(pieces)
    assert joiner_task is not None
    joined = await joiner_task
    assert "".join(pieces) == long_solo
    assert joined["choices"][0]["message"]["content"] == joiner_solo
    assert pieces_when_joiner_done is not None, "the joiner only finished after the running stream"


async def test_cancelled_stream_frees_its_slot_and_logs_abort(worker: Worker, client: httpx.AsyncClient) -> None:
    before = worker.health()["aborted_total"]
    body = chat_body("Write an endless poem.", max_tokens=CTX, ignore_eos=True, stream=True, seed=3)
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        received = 0
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                request_id = json.loads(line[len("data: ") :])["id"]
                received += 1
                if received == 3:
                    break
    line = worker.wait_for_log("aborted", request_id, timeout_s=5)
    assert "done" not in line
    health = worker.wait_idle(timeout_s=5)
    assert health["aborted_total"] == before + 1
    assert health["kv_cells_used"] == 0


async def test_disconnected_non_streaming_request_is_aborted(worker: Worker) -> None:
    before = worker.health()["aborted_total"]
    body = chat_body("Write an endless poem.", max_tokens=CTX, ignore_eos=True, seed=4)
    async with httpx.AsyncClient(base_url=worker.url, timeout=0.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await impatient.post("/v1/chat/completions", json=body)
    worker.wait_for_log("aborted", timeout_s=5)
    health = worker.wait_idle(timeout_s=5)
    assert health["aborted_total"] == before + 1
    assert health["generation_tokens_total"] > 0


async def test_more_requests_than_slots_queue_then_run(worker: Worker, client: httpx.AsyncClient) -> None:
    n = SLOTS * 2 + 2
    observed: list[dict[str, Any]] = []

    async def watch() -> None:
        while True:
            observed.append((await client.get("/health")).json())
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(
            *(
                run_case(client, {"content": f"Story {i}", "max_tokens": 24, "ignore_eos": True, "seed": i})
                for i in range(n)
            )
        )
    finally:
        watcher.cancel()
    assert [r[1:] for r in results] == [("length", 24)] * n
    assert max(h["slots_busy"] for h in observed) == SLOTS
    assert max(h["queue_depth"] for h in observed) >= 1
    worker.wait_idle()


async def test_queue_overflow_is_429(worker: Worker, client: httpx.AsyncClient) -> None:
    body = chat_body("Write an endless poem.", max_tokens=CTX, ignore_eos=True, stream=True, seed=5)
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as holder:
        streams = []
        try:
            for _ in range(SLOTS + MAX_QUEUE):
                request = holder.build_request("POST", "/v1/chat/completions", json=body)
                response = await holder.send(request, stream=True)
                assert response.status_code == 200
                streams.append(response)
            overflow = await client.post("/v1/chat/completions", json=chat_body("hi", max_tokens=2))
            assert overflow.status_code == 429
            assert overflow.json()["error"]["code"] == "queue_full"
        finally:
            for response in streams:
                await response.aclose()
    worker.wait_idle(timeout_s=10)


async def test_prefix_reuse_skips_cached_prompt_tokens(worker: Worker, client: httpx.AsyncClient) -> None:
    system = "You are a patient librarian. " + " ".join(f"Rule {i}: be kind to readers." for i in range(40))

    def conversation(question: str) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "temperature": 0,
            "max_tokens": 4,
        }

    first = await post(client, "/v1/chat/completions", conversation("Where are the maps?"))
    second = await post(client, "/v1/chat/completions", conversation("Where are the novels?"))
    shared = first["usage"]["prompt_tokens"] - 12  # the two prompts differ only in the last few tokens
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < shared
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert shared <= cached < second["usage"]["prompt_tokens"]
    worker.wait_for_log(second["id"], f"cached={cached}")
