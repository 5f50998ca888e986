"""Helpers for the team-ready e2e suites: raw SSE reading, the gateway's worker processes, and its metrics."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL, Gateway

WORKER_MODULE = "backends.llamacpp.worker"
# A prompt SmolLM2 continues for as long as it is allowed to (deterministic at temperature 0).
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


@dataclass
class SSE:
    """What a client saw on one streamed response."""

    status: int
    headers: httpx.Headers
    data: list[str] = field(default_factory=list)  # payloads of `data:` frames, in order
    comments: list[str] = field(default_factory=list)  # `:` lines
    body: bytes = b""

    @property
    def done(self) -> bool:
        return bool(self.data) and self.data[-1] == "[DONE]"

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [json.loads(d)["error"] for d in self.data if d.startswith('{"error"')]

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(d) for d in self.data if d.startswith("{") and not d.startswith('{"error"')]

    def text(self) -> str:
        out = []
        for chunk in self.chunks:
            for choice in chunk.get("choices") or []:
                out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
        return "".join(out)


def parse_sse(raw: bytes, sse: SSE) -> None:
    for line in raw.decode(errors="replace").split("\n"):
        if line.startswith("data: "):
            sse.data.append(line[6:])
        elif line.startswith(":"):
            sse.comments.append(line)


@contextlib.asynccontextmanager
async def open_stream(
    url: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
) -> AsyncIterator[httpx.Response]:
    """POST a streaming request on a connection of its own; leaving the block closes it (the client leaves)."""
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream("POST", url, json=body, headers=headers) as response,
    ):
        yield response


async def stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
) -> SSE:
    """POST a streaming request and read it to the end."""
    async with client.stream("POST", url, json=body, headers=headers) as response:
        raw = await response.aread()
    sse = SSE(response.status_code, response.headers, body=raw)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        parse_sse(raw, sse)
    return sse


def chat_body(prompt: str = "Say hi.", max_tokens: int = 8, model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **extra,
    }


def counting_body(max_tokens: int, model: str = MODEL) -> dict[str, Any]:
    """A /v1/completions stream that keeps generating until max_tokens: holds a slot for a while."""
    return {"model": model, "prompt": COUNTING, "max_tokens": max_tokens, "temperature": 0, "stream": True}


# -- processes ------------------------------------------------------------------------------------------
def worker_processes(gateway: Gateway) -> list[psutil.Process]:
    """The llama.cpp worker processes the gateway started (they run in their own sessions)."""
    try:
        children = psutil.Process(gateway.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for proc in children:
        try:
            if WORKER_MODULE in " ".join(proc.cmdline()):
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def worker_for(gateway: Gateway, model: str = MODEL) -> psutil.Process:
    matches = [p for p in worker_processes(gateway) if _flag(p.cmdline(), "--model-name") == model]
    assert len(matches) == 1, [p.cmdline() for p in worker_processes(gateway)]
    return matches[0]


def worker_port(proc: psutil.Process) -> int:
    return int(_flag(proc.cmdline(), "--port"))


def workers_on_ports(ports: set[int]) -> list[psutil.Process]:
    """Any process on the machine that is a llama.cpp worker listening on one of `ports` (orphan check)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if WORKER_MODULE not in " ".join(cmdline) or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if int(_flag(cmdline, "--port")) in ports:
                found.append(proc)
        except (ValueError, IndexError):
            continue
    return found


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def worker_health(gateway: Gateway, model: str = MODEL) -> dict[str, Any]:
    """The worker's own /health, asked directly (bypassing the gateway)."""
    port = worker_port(worker_for(gateway, model))
    response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def ready_model(gateway: Gateway, model: str = MODEL) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(gateway.url + "/ready", timeout=5).json()["models"][model]
    return data


def wait_until_idle(
    gateway: Gateway, model: str = MODEL, timeout_s: float = 20
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait until neither the gateway's admission nor the worker holds a request; return both views."""
    deadline = time.monotonic() + timeout_s
    while True:
        admission, health = ready_model(gateway, model), worker_health(gateway, model)
        if (admission["running"], admission["waiting"], health.get("slots_busy")) == (0, 0, 0):
            return admission, health
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle after {timeout_s} s: gateway {admission}, worker {health}")
        time.sleep(0.1)


# -- metrics --------------------------------------------------------------------------------------------
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(gateway: Gateway) -> Samples:
    response = httpx.get(gateway.url + "/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def metric(samples: Samples, name: str, /, **labels: str) -> float | None:
    """The value of the one sample `name` whose labels include `labels` (None if absent)."""
    want = set(labels.items())
    hits = [v for (n, lbls), v in samples.items() if n == name and want <= lbls]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None
