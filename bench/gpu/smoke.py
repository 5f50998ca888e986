"""The gateway-core scenarios, run with the openai SDK against a live gateway (used on the GPU machine).

    python -m bench.gpu.smoke --base-url http://127.0.0.1:8000/v1 --model NAME [--concurrency 32]

Prints one JSON line per scenario ({"scenario", "ok", ...details}) and exits non-zero if any failed.
Random-weight models produce gibberish, so checks are about shape, counts and lifecycle, not wording.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai

PROMPT = [{"role": "user", "content": "Tell me about the history of the V100 graphics card in detail."}]


def scenario(results: list[dict[str, Any]], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    started = time.perf_counter()
    try:
        detail = fn()
        entry = {"scenario": name, "ok": True, **detail}
    except Exception as exc:  # a smoke run reports every failure, then exits non-zero
        entry = {"scenario": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    entry["seconds"] = round(time.perf_counter() - started, 2)
    results.append(entry)
    print(json.dumps(entry), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="smoke", max_retries=0, timeout=300)
    root = args.base_url.removesuffix("/v1")
    results: list[dict[str, Any]] = []

    def models() -> dict[str, Any]:
        ids = [m.id for m in client.models.list().data]
        assert args.model in ids, ids
        return {"models": ids}

    def non_stream() -> dict[str, Any]:
        r = client.chat.completions.create(model=args.model, messages=PROMPT, max_tokens=args.max_tokens)
        assert r.choices[0].message.content is not None and r.usage is not None
        assert r.choices[0].message.refusal is None
        return {"finish_reason": r.choices[0].finish_reason, "usage": r.usage.model_dump()}

    def stream_usage() -> dict[str, Any]:
        chunks = list(
            client.chat.completions.create(
                model=args.model,
                messages=PROMPT,
                max_tokens=args.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].choices == [] and chunks[-1].usage is not None, chunks[-1]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return {"chunks": len(chunks), "chars": len(text), "usage": chunks[-1].usage.model_dump()}

    def length() -> dict[str, Any]:
        r = client.chat.completions.create(model=args.model, messages=PROMPT, max_tokens=5)
        assert r.choices[0].finish_reason == "length", r.choices[0].finish_reason
        assert r.usage is not None and r.usage.completion_tokens == 5, r.usage
        return {"usage": r.usage.model_dump()}

    def completion() -> dict[str, Any]:
        r = client.completions.create(model=args.model, prompt="The V100 is", max_tokens=8)
        assert r.usage is not None and r.usage.completion_tokens <= 8
        return {"finish_reason": r.choices[0].finish_reason}

    def disconnect() -> dict[str, Any]:
        body = {"model": args.model, "messages": PROMPT, "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", args.base_url + "/chat/completions", json=body, timeout=120) as response:
            lines = response.iter_lines()
            for _ in range(10):
                next(lines)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            running = httpx.get(root + "/ready", timeout=5).json()["models"][args.model]["running"]
            if running == 0:
                break
            time.sleep(0.1)
        assert running == 0, f"{running} still running after disconnect"
        r = client.chat.completions.create(model=args.model, messages=PROMPT, max_tokens=4)
        return {"next_request_finish": r.choices[0].finish_reason}

    def concurrent() -> dict[str, Any]:
        def one(i: int) -> tuple[int, bool, int]:
            body = {
                "model": args.model,
                "messages": [{"role": "user", "content": f"Story number {i}"}],
                "max_tokens": args.max_tokens,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            with httpx.stream("POST", args.base_url + "/chat/completions", json=body, timeout=300) as response:
                raw = response.read().decode()
            usage = [
                json.loads(e[6:])["usage"]
                for e in raw.split("\n\n")
                if e.startswith('data: {"') and '"choices":[]' in e.replace(" ", "")
            ]
            return (
                response.status_code,
                raw.endswith("data: [DONE]\n\n"),
                usage[0]["completion_tokens"] if usage else -1,
            )

        started = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            out = list(pool.map(one, range(args.concurrency)))
        wall = time.perf_counter() - started
        assert all(status == 200 and done for status, done, _ in out), out
        tokens = sum(n for _, _, n in out)
        return {
            "streams": len(out),
            "all_done": True,
            "tokens": tokens,
            "wall_s": round(wall, 2),
            "aggregate_tok_s": round(tokens / wall, 1),
        }

    def errors() -> dict[str, Any]:
        try:
            client.chat.completions.create(model="no-such-model", messages=PROMPT)
            raise AssertionError("expected 404")
        except openai.NotFoundError as exc:
            assert exc.code == "model_not_found"
        try:
            client.chat.completions.create(model=args.model, messages=PROMPT, n=3)
            raise AssertionError("expected 400")
        except openai.BadRequestError as exc:
            assert exc.param == "n"
        return {"not_found": "ok", "n>1": "ok"}

    for name, fn in [
        ("models", models),
        ("non_stream", non_stream),
        ("stream_include_usage", stream_usage),
        ("max_tokens_length", length),
        ("completions", completion),
        ("disconnect_aborts", disconnect),
        (f"concurrent_{args.concurrency}", concurrent),
        ("errors", errors),
    ]:
        scenario(results, name, fn)
    failed = [r["scenario"] for r in results if not r["ok"]]
    print(json.dumps({"summary": "smoke", "passed": len(results) - len(failed), "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
