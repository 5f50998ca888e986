"""Replicas (config `replicas: 2`): two real llama.cpp workers of SmolLM2 behind one model name, through
`voltgate serve` and the OpenAI SDK. Requests spread by load, a session's turns return to the replica that holds
its prefix (the worker's own cached-token count), and a replica killed mid-stream costs only its stream."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, write_config
from tests.e2e.streams import counting_body, worker_for

pytestmark = pytest.mark.e2e

REPLICA = f"{MODEL}@2"
SESSION_PROMPT = " ".join(f"Note {i}: the warehouse on row {i} holds {i * 7} crates of apples." for i in range(60))


@pytest.fixture(scope="module")
def replicated(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("replicas")
    entry = model_entry(smollm2_path, concurrency=1, replicas=2)
    with running_gateway(write_config(tmp, smollm2_path, free_port(), models=[entry]), tmp / "gateway.log") as gw:
        yield gw


def picks(gateway: Gateway) -> dict[tuple[str, str], float]:
    """voltgate:replica_picks_total by (replica, reason)."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    pattern = r'voltgate:replica_picks_total\{model="[^"]+",reason="(\w+)",replica="([^"]+)"\} ([0-9.e+]+)'
    return {(replica, reason): float(v) for reason, replica, v in re.findall(pattern, text)}


def test_the_model_is_listed_once_and_both_replicas_run(replicated: Gateway) -> None:
    ids = [m.id for m in replicated.client().models.list().data]
    assert ids.count(MODEL) == 1 and REPLICA not in ids
    assert worker_for(replicated, MODEL).pid != worker_for(replicated, REPLICA).pid
    status = httpx.get(f"{replicated.url}/ui/api/status", timeout=10).json()  # the status page: grouped, both ready
    rows = [(m["name"], m["replica_of"], m["state"]) for m in status["models"]]
    assert rows == [(MODEL, None, "ready"), (REPLICA, MODEL, "ready")]


def test_concurrent_requests_go_to_different_replicas(replicated: Gateway) -> None:
    before = picks(replicated)
    client = replicated.client()
    done: list[str] = []

    def one() -> None:
        body = counting_body(48)
        with client.completions.create(**body) as stream:
            done.append("".join(c.choices[0].text for c in stream if c.choices))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(done) == 2 and all(done)
    after = picks(replicated)
    gained = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    assert gained.get((MODEL, "load"), 0) >= 1 and gained.get((REPLICA, "load"), 0) >= 1, gained


def test_a_sessions_turns_return_to_its_replica_and_find_their_prefix(replicated: Gateway) -> None:
    client = replicated.client()
    messages = [{"role": "user", "content": SESSION_PROMPT + " How many crates are on row 3?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, user="session-a")
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "And on row 4?"}]  # fmt: skip
    before = picks(replicated)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, user="session-a")
    gained = {k: v - before.get(k, 0) for k, v in picks(replicated).items() if v > before.get(k, 0)}
    assert list(gained) in ([(MODEL, "session")], [(REPLICA, "session")]), gained
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens >= first.usage.prompt_tokens - 8  # the first turn's prompt, from the same slot


def test_a_killed_replica_costs_only_its_stream(replicated: Gateway) -> None:
    client = replicated.client()
    victim = worker_for(replicated, REPLICA)
    held = threading.Event()
    outcome: list[BaseException | str] = []

    def long_stream() -> None:  # occupies the first replica, so the next request goes to the second
        try:
            with client.completions.create(**counting_body(200)) as stream:
                held.set()
                outcome.append("".join(c.choices[0].text for c in stream if c.choices))
        except openai.APIError as exc:
            outcome.append(exc)

    keeper = threading.Thread(target=long_stream)
    keeper.start()
    assert held.wait(120)
    stream = client.completions.create(**counting_body(200))
    next(iter(stream))  # the second replica is streaming
    victim.kill()
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    keeper.join(300)
    assert outcome and isinstance(outcome[0], str) and outcome[0]  # the other replica's stream was untouched
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert answer.choices[0].message.content is not None  # the model keeps answering
