"""Async streaming load generator after vLLM's benchmark_serving: concurrency sweeps or Poisson rates.

Every request streams (`stream_options.include_usage`) with a fixed output length (`max_tokens` plus the
`ignore_eos` extension), or lengths sampled within ±`--range-ratio`, and a distinct seeded prompt, so prefix
caches cannot flatter the numbers. Per request it records TTFT, inter-token latencies, end-to-end latency,
tokens and status; per level it reports p50/p90/p99, output tok/s, req/s and error counts. Import
`run_level`/`sweep`, or run it:

    python -m bench.loadgen --base-url http://127.0.0.1:8000/v1 --model smollm2-135m \\
        --concurrency 1 2 4 8 --output-tokens 64 --output out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from bench import provenance
from bench.stats import RequestRecord, summarize

Endpoint = Literal["chat", "completions"]

# Short common words: each is about one token with its leading space in Llama-family BPE vocabularies.
_WORDS_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set put end does "
    "another well large must big even such because turn here why ask went men read need land different home "
    "us move try kind hand picture again change off play spell air away animal house point page letter "
    "mother answer found study still learn should world high every near add food between own below country "
    "plant last school father keep tree never start city earth eye light thought head under story saw left"
)
WORDS = tuple(_WORDS_TEXT.split())


def make_prompt(n_words: int, seed: int) -> str:
    """A deterministic prompt of `n_words` words; different seeds differ from the first word on."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@dataclass(frozen=True)
class LoadSpec:
    """What each request looks like and where it goes. `base_url` ends in `/v1`."""

    base_url: str
    model: str
    endpoint: Endpoint = "completions"
    prompt_tokens: int = 64
    output_tokens: int = 64
    ignore_eos: bool = True
    temperature: float = 0.0
    api_key: str | None = None
    timeout_s: float = 600.0
    seed: int = 0
    range_ratio: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        return f"{self.base_url.rstrip('/')}/{path}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def lengths(self, index: int) -> tuple[int, int]:
        """(prompt words, output tokens) of request `index`: fixed, or sampled uniformly within
        ±`range_ratio` of the nominal lengths (vLLM's random-range-ratio), reproducibly per index."""
        if not self.range_ratio:
            return self.prompt_tokens, self.output_tokens
        rng = random.Random(self.seed * 7_919 + index)

        def draw(n: int) -> int:
            return max(1, round(rng.uniform(n * (1 - self.range_ratio), n * (1 + self.range_ratio))))

        return draw(self.prompt_tokens), draw(self.output_tokens)

    def payload(self, index: int) -> dict[str, Any]:
        prompt_words, output_tokens = self.lengths(index)
        prompt = make_prompt(prompt_words, self.seed * 1_000_003 + index)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": output_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body.update(self.extra_body)
        return body

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["api_key"] = "<set>" if self.api_key else None
        return data


DONE = object()


def parse_sse_line(line: str) -> dict[str, Any] | object | None:
    """One SSE line → its JSON payload, `DONE` for `data: [DONE]`, or None (blank, comment, other field)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return DONE
    if not data:
        return None
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return {"error": {"message": f"unparseable SSE data: {data[:80]}"}}
    return obj if isinstance(obj, dict) else {"error": {"message": "SSE data is not an object"}}


def chunk_text(chunk: dict[str, Any]) -> str:
    """The generated text a chat or completions chunk carries ('' for role-only or usage chunks)."""
    text = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if piece:
            text.append(piece)
    return "".join(text)


async def send_one(client: httpx.AsyncClient, spec: LoadSpec, index: int, t0: float) -> RequestRecord:
    """Stream one request and record its timings; never raises for HTTP or stream failures."""
    record = RequestRecord(index=index)
    payload = spec.payload(index)
    start = time.perf_counter()
    record.start_s = start - t0
    last: float | None = None
    usage_tokens: int | None = None
    saw_done = False
    try:
        async with client.stream("POST", spec.url, json=payload, headers=spec.headers()) as response:
            record.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                record.error = f"http_{response.status_code}"
                record.e2e_s = time.perf_counter() - start
                return record
            async for line in response.aiter_lines():
                event = parse_sse_line(line)
                if event is None:
                    continue
                now = time.perf_counter()
                if event is DONE:
                    saw_done = True
                    continue
                assert isinstance(event, dict)
                record.chunks += 1
                if "error" in event:
                    record.error = "stream_error"
                    continue
                if chunk_text(event):
                    if last is None:
                        record.ttft_s = now - start
                    else:
                        record.itl_s.append(now - last)
                    last = now
                    record.content_chunks += 1
                usage = event.get("usage")
                if isinstance(usage, dict):
                    record.prompt_tokens = usage.get("prompt_tokens")
                    usage_tokens = usage.get("completion_tokens")
    except httpx.TimeoutException:
        record.error = "timeout"
    except httpx.HTTPError as exc:
        record.error = type(exc).__name__
    record.e2e_s = time.perf_counter() - start
    record.output_tokens = usage_tokens if usage_tokens is not None else record.content_chunks
    if record.error is None and not saw_done:
        record.error = "no_done"
    if record.error is None and record.ttft_s is None:
        record.error = "no_content"
    record.ok = record.error is None
    return record


@dataclass
class LevelResult:
    """One level of a sweep: its load shape, the records and their summary."""

    concurrency: int | None
    request_rate: float | None
    records: list[RequestRecord]
    duration_s: float
    label: str | None = None

    @property
    def summary(self) -> dict[str, Any]:
        return summarize(self.records, self.duration_s)

    def to_json(self, *, with_requests: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "label": self.label,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "summary": self.summary,
        }
        if with_requests:
            data["requests"] = [r.to_json() for r in self.records]
        return data


def make_client(max_connections: int, timeout_s: float = 600.0) -> httpx.AsyncClient:
    """A keep-alive client sized for the load; `trust_env=False` so a proxy setting never touches loopback."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        trust_env=False,
    )


async def run_level(
    client: httpx.AsyncClient,
    spec: LoadSpec,
    *,
    num_requests: int,
    concurrency: int | None = None,
    request_rate: float | None = None,
    first_index: int = 0,
    label: str | None = None,
) -> LevelResult:
    """Send `num_requests` requests: closed loop with `concurrency` in flight, or Poisson arrivals at
    `request_rate` per second (capped at `concurrency` in flight when both are given)."""
    if concurrency is None and request_rate is None:
        raise ValueError("give a concurrency, a request rate, or both")
    records: list[RequestRecord] = []
    t0 = time.perf_counter()
    if request_rate is None or math.isinf(request_rate):
        assert concurrency is not None or request_rate is not None
        in_flight = concurrency if concurrency is not None else num_requests
        next_index = iter(range(first_index, first_index + num_requests))

        async def worker() -> None:
            for index in next_index:
                records.append(await send_one(client, spec, index, t0))

        await asyncio.gather(*(worker() for _ in range(min(in_flight, num_requests))))
    else:
        rng = random.Random(spec.seed + first_index)
        limit = asyncio.Semaphore(concurrency) if concurrency else None

        async def limited(index: int) -> None:
            if limit is None:
                records.append(await send_one(client, spec, index, t0))
                return
            async with limit:
                records.append(await send_one(client, spec, index, t0))

        tasks = []
        for index in range(first_index, first_index + num_requests):
            tasks.append(asyncio.create_task(limited(index)))
            await asyncio.sleep(rng.expovariate(request_rate))
        await asyncio.gather(*tasks)
    duration = time.perf_counter() - t0
    records.sort(key=lambda r: r.index)
    return LevelResult(concurrency, request_rate, records, duration, label)


def default_requests(concurrency: int | None) -> int:
    """Requests per level when none are given: enough for every stream to run at least twice."""
    return max(16, 2 * (concurrency or 8))


async def sweep(
    spec: LoadSpec,
    *,
    concurrencies: Sequence[int] = (),
    rates: Sequence[float] = (),
    max_concurrency: int | None = None,
    num_requests: int | None = None,
    warmup: int = 1,
    label: str | None = None,
    progress: bool = True,
) -> list[LevelResult]:
    """Run each concurrency level (or each request rate) in turn over one keep-alive client."""
    shapes: list[tuple[int | None, float | None]] = [(c, None) for c in concurrencies]
    shapes += [(max_concurrency, r) for r in rates]
    cap = max([c for c, _ in shapes if c] + [num_requests or 0, 64])
    results = []
    index = 0
    async with make_client(cap, spec.timeout_s) as client:
        if warmup:
            warm = await run_level(client, spec, num_requests=warmup, concurrency=warmup, first_index=10**9)
            if not all(r.ok for r in warm.records):
                errors = warm.summary["errors"]
                raise RuntimeError(f"warm-up requests to {spec.url} failed: {errors}")
        for concurrency, rate in shapes:
            n = num_requests or default_requests(concurrency)
            level = await run_level(
                client,
                spec,
                num_requests=n,
                concurrency=concurrency,
                request_rate=rate,
                first_index=index,
                label=label,
            )
            index += n
            results.append(level)
            if progress:
                print(format_row(level), file=sys.stderr, flush=True)
    return results


async def server_info(base_url: str, api_key: str | None = None) -> dict[str, Any]:
    """What the server says about itself: `/v1/models` and the root `/health`, best effort."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    info: dict[str, Any] = {"base_url": base_url}
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        for key, url in (("models", f"{base_url.rstrip('/')}/models"), ("health", f"{root}/health")):
            try:
                response = await client.get(url, headers=headers)
                ok = response.status_code == 200
                info[key] = response.json() if ok else {"status": response.status_code}
            except (httpx.HTTPError, ValueError) as exc:
                info[key] = {"error": type(exc).__name__}
    return info


def format_row(level: LevelResult) -> str:
    s = level.summary
    shape = f"c={level.concurrency}" if level.request_rate is None else f"rate={level.request_rate}"
    return (
        f"{level.label or ''} {shape:>8} ok={s['completed']}/{s['requests']} "
        f"out={_fmt(s['output_throughput'])} tok/s req={_fmt(s['request_throughput'], 2)}/s "
        f"ttft p50={_fmt(s['ttft_ms']['p50'], 1)} p99={_fmt(s['ttft_ms']['p99'], 1)} ms "
        f"itl p50={_fmt(s['itl_ms']['p50'], 2)} ms errors={s['errors'] or '-'}"
    ).strip()


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="OpenAI base URL ending in /v1")
    p.add_argument("--model", required=True)
    p.add_argument("--endpoint", choices=("chat", "completions"), default="completions")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prompt length in words (≈ tokens)")
    p.add_argument("--output-tokens", type=int, default=64, help="max_tokens, with ignore_eos")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send the ignore_eos extension")
    p.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="sample lengths uniformly within ±R of --prompt-tokens/--output-tokens (0 = fixed)",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=int, nargs="+", help="closed-loop levels, e.g. 1 2 4 8 16 32 64")
    load.add_argument("--request-rate", type=float, nargs="+", help="Poisson rates, req/s (inf = burst)")
    p.add_argument("--max-concurrency", type=int, help="cap on requests in flight in request-rate mode")
    p.add_argument("--num-requests", type=int, help="requests per level (default max(16, 2 x concurrency))")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests before the first level")
    p.add_argument("--api-key", default=os.environ.get("VOLTGATE_API_KEY"), help="default $VOLTGATE_API_KEY")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", help="series name in plots (engine/quant/slots/path)")
    p.add_argument("--model-path", type=Path, help="GGUF file, to record the model's shape")
    p.add_argument("--notes", default="", help="free text stored with the result")
    p.add_argument("--output", type=Path, help="write the JSON result here")
    p.add_argument("--save-requests", action="store_true", help="include per-request records in the JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spec = LoadSpec(
        base_url=args.base_url,
        model=args.model,
        endpoint=args.endpoint,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        ignore_eos=not args.no_ignore_eos,
        temperature=args.temperature,
        api_key=args.api_key,
        seed=args.seed,
        range_ratio=args.range_ratio,
    )
    meta = provenance.collect(
        model_shape=provenance.gguf_shape(args.model_path) if args.model_path else None, notes=args.notes
    )

    async def _run() -> tuple[dict[str, Any], list[LevelResult]]:
        info = await server_info(spec.base_url, spec.api_key)
        levels = await sweep(
            spec,
            concurrencies=args.concurrency or (),
            rates=args.request_rate or (),
            max_concurrency=args.max_concurrency,
            num_requests=args.num_requests,
            warmup=args.warmup,
            label=args.label,
        )
        return info, levels

    info, levels = asyncio.run(_run())
    result = {
        "kind": "loadgen",
        "label": args.label or args.model,
        "meta": meta,
        "server": info,
        "spec": spec.describe(),
        "levels": [lv.to_json(with_requests=args.save_requests) for lv in levels],
    }
    text = json.dumps(result, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0 if all(lv.summary["completed"] for lv in levels) else 1


if __name__ == "__main__":
    raise SystemExit(main())
