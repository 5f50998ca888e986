"""Replicas (config `replicas: 2`): two real llama.cpp workers of SmolLM2 behind one model name, through
`voltgate serve` and the OpenAI SDK. Requests spread by load, a session's turns return to the replica that holds
its prefix (the worker's own cached-token count), a replica killed mid-stream costs only its stream, and the
requests queued at a killed replica are answered by the other (sent again: `voltgate:replica_retries_total`)."""

from __future__ import annotations

import re
import threading
import time
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


def gauge(gateway: Gateway, name: str, model: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    found = re.search(rf'{re.escape(name)}\{{model="{re.escape(model)}"\}} ([0-9.e+]+)', text)
    return float(found.group(1)) if found else 0.0


def retries(gateway: Gateway) -> dict[tuple[str, str], float]:
    """voltgate:replica_retries_total by (from_replica, reason)."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    pattern = r'voltgate:replica_retries_total\{from_replica="([^"]+)",model="[^"]+",reason="(\w+)"\} ([0-9.e+]+)'
    return {(replica, reason): float(v) for replica, reason, v in re.findall(pattern, text)}


def wait_until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def both_ready(gateway: Gateway) -> bool:
    status = httpx.get(f"{gateway.url}/ui/api/status", timeout=10).json()
    return all(m["state"] == "ready" for m in status["models"])


def test_requests_queued_at_a_killed_replica_are_answered_by_the_other(replicated: Gateway) -> None:
    """The victim's one slot is held by a session's long stream and the session's next three turns queue behind
    it (session affinity); its worker is killed with SIGKILL. The stream that had bytes ends with its error; the
    queued requests, which its worker never answered, are sent to the other replica: 200, not 503."""
    wait_until(lambda: both_ready(replicated), 180, "both replicas ready (an earlier test killed one)")
    client = replicated.client()
    before = picks(replicated)
    held, outcome = threading.Event(), []

    def hold() -> None:  # the session's first turn: a long stream on the replica the router picks
        try:
            with client.completions.create(**counting_body(400), user="doomed") as stream:
                for _ in stream:
                    held.set()
            outcome.append("completed")
        except openai.APIError as exc:
            outcome.append(exc)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(120)
    gained = [replica for (replica, _), v in picks(replicated).items() if v > before.get((replica, _), 0)]
    assert len(gained) == 1, gained
    victim, survivor = gained[0], REPLICA if gained[0] == MODEL else MODEL
    answers: list[str | BaseException] = []

    def turn(i: int) -> None:
        try:
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=4, user="doomed"
            )
            answers.append(answer.choices[0].message.content or "")
        except openai.APIError as exc:
            answers.append(exc)

    turns = [threading.Thread(target=turn, args=(i,)) for i in range(3)]
    for t in turns:
        t.start()
    wait_until(lambda: gauge(replicated, "voltgate:num_requests_waiting", victim) == 3, 60, "3 queued at the victim")
    worker_for(replicated, victim).kill()
    for t in [holder, *turns]:
        t.join(300)
    assert len(outcome) == 1 and isinstance(outcome[0], openai.APIError)  # it had relayed bytes: not sent again
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers), answers  # 200s, from the survivor
    gained_retries = retries(replicated)
    assert sum(v for (replica, _), v in gained_retries.items() if replica == victim) == 3, gained_retries
    assert all(replica != survivor for replica, _ in gained_retries)
