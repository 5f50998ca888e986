"""Where a TurboMind cached turn's time goes (issue 41), ON THE GPU MACHINE (it imports lmdeploy).

The session replay found TurboMind's cached agent turns 2.3-5.5x as slow to their first token as a one-turn
prompt of their new text (`bench/results/2026-12-06-gpu-depth-h200-eddd48e/`), and LMDeploy reports no cached
token count to say why. This splits one turn's time to first token by sending the same turn three ways:

- `gateway`: the chat request through voltgate (what a client gets);
- `chat`: the same messages and tools straight to LMDeploy's `/v1/chat/completions` (LMDeploy renders the chat
  template and tokenizes the whole conversation, in its event loop, every turn);
- `ids`: the same prompt as token ids (`input_ids`, messages empty, LMDeploy 0.18's fallback input): no template,
  no tokenizer, the engine and its prefix cache alone;

and times, in this process on the same CPU, what LMDeploy does per turn before the engine sees it: its chat
template (`get_chat_template(...).messages2prompt`, Hugging Face's `apply_chat_template`) and its tokenizer
(`Tokenizer.encode`). Beside each turn: `fresh`, a prompt of random token ids as long as what the engine had to
prefill (the turn's tokens past the longest prefix shared with the last turn, cut back to a whole cache block):
the engine's own one-turn baseline of the new tokens.

The session is the recorded Open WebUI chat (`bench.sessions`, 36 tools, 13k tokens by turn 8; its background
tasks left out): the chat API passes through voltgate as it is, so the three paths send the same conversation.
Each pass replays the same turns (the first pass's answers) with its own nonce at the head of the first user
message, so no pass finds another's conversation cached (a template that renders the tools before the messages,
as the 8B's does, shares the tools' blocks between passes: turn 1 is then mostly cached, turns 2-8 are cached
up to the pass's own last turn either way); the passes run gateway, chat, ids, ids, chat, gateway.

A stand-in cannot run this: it needs LMDeploy's TurboMind and its tokenizer (`bench/gpu/run_regress.sh`,
step `split:tm8b`). Its table functions are unit-tested on the CPU (tests/unit/test_bench_tm_turn_split.py).

    python3 -m bench.gpu.tm_turn_split --model-path /tmp/gpu/models/8b --model llama3-8b \\
        --lmdeploy-url http://127.0.0.1:PORT --gateway-url http://127.0.0.1:8000 --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.report import fmt, md_table
from bench.session_replay import stream_request
from bench.sessions import AgentSession, Turn
from bench.stats import median, ratio

PASSES = ("gateway", "chat", "ids", "ids", "chat", "gateway")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest prefix `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def uncached_count(ids: Sequence[int], previous: Sequence[int], block: int) -> int:
    """What a prefix cache of whole `block`-token blocks leaves to prefill of `ids` after `previous`."""
    return len(ids) - common_prefix(ids, previous) // block * block


def with_nonce(body: dict[str, Any], nonce: str) -> dict[str, Any]:
    """`body` with `[nonce]` at the head of its first message's text (a copy; the body is left as it is)."""
    messages = [dict(m) for m in body["messages"]]
    messages[0]["content"] = f"[{nonce}] {messages[0]['content']}"
    return body | {"messages": messages}


@dataclass
class TurnSplit:
    """One turn: each path's TTFTs and LMDeploy's template and tokenizer time (one per pass), the fresh baseline."""

    turn: int
    prompt_tokens: int = 0
    uncached_tokens: int = 0
    reported_prompt_tokens: dict[str, list[int]] = field(default_factory=dict)
    reported_cached_tokens: dict[str, list[int | None]] = field(default_factory=dict)
    """What each path's usage says the prefix cache served (None: no count in it)."""
    ttft_ms: dict[str, list[float]] = field(default_factory=dict)
    fresh_ttft_ms: list[float] = field(default_factory=list)
    template_ms: list[float] = field(default_factory=list)
    encode_ms: list[float] = field(default_factory=list)


HEADERS = ("turn", "prompt tokens", "uncached (blocks)", "LMDeploy's cached", "gateway ms", "chat ms", "ids ms",
           "fresh ms", "template ms", "encode ms", "chat - ids", "ids / fresh", "gateway / fresh")  # fmt: skip


def split_table(rows: Sequence[TurnSplit]) -> str:
    """Markdown: per turn the medians of each path, the CPU's share and the engine's baseline."""
    out = []
    for r in rows:
        gw, chat, ids = (median(r.ttft_ms.get(p, [])) for p in ("gateway", "chat", "ids"))
        fresh = median(r.fresh_ttft_ms)
        gap = None if chat is None or ids is None else chat - ids
        out.append((r.turn + 1, fmt(r.prompt_tokens, 0), fmt(r.uncached_tokens, 0), _said(r), fmt(gw), fmt(chat),
                    fmt(ids), fmt(fresh), fmt(median(r.template_ms)), fmt(median(r.encode_ms)), fmt(gap),
                    fmt(ratio(ids, fresh), 2), fmt(ratio(gw, fresh), 2)))  # fmt: skip
    return md_table(HEADERS, out)


def _said(r: TurnSplit) -> str:
    """The cached counts LMDeploy's chat path reported (of its own prompt tokens), "-" where it gave none."""
    pairs = zip(r.reported_cached_tokens.get("chat", []), r.reported_prompt_tokens.get("chat", []), strict=False)
    return "; ".join(f"{c:,} / {p:,}" for c, p in pairs if c is not None) or "-"


def _timed(fn: Callable[[], Any], reps: int = 3) -> tuple[Any, float]:
    """`fn()`'s value and its median wall time over `reps` calls, in ms."""
    times, value = [], None
    for _ in range(reps):
        start = time.perf_counter()
        value = fn()
        times.append((time.perf_counter() - start) * 1000)
    return value, median(times) or 0.0


class Prompter:
    """LMDeploy's own chat template and tokenizer for the model, as its api_server builds them."""

    def __init__(self, model_path: str) -> None:
        from lmdeploy.model import get_chat_template  # the GPU machine's pack; never imported by the gateway
        from lmdeploy.tokenizer import Tokenizer

        self.template = get_chat_template(model_path, None)
        self.tokenizer = Tokenizer(model_path)

    def ids(self, body: dict[str, Any]) -> tuple[list[int], float, float]:
        """The prompt's token ids and the template's and the tokenizer's median ms."""
        text, template_ms = _timed(lambda: self.template.messages2prompt(body["messages"], tools=body.get("tools")))
        ids, encode_ms = _timed(lambda: self.tokenizer.encode(text, add_bos=True))
        return list(ids), template_ms, encode_ms


def _direct_body(body: dict[str, Any], ids: list[int] | None) -> dict[str, Any]:
    out = {k: body[k] for k in ("model", "messages", "tools", "max_tokens") if k in body}
    out |= {"stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    if ids is not None:
        out |= {"messages": [], "input_ids": ids}
        out.pop("tools", None)
    return out


async def record_turns(client_base: str, model: str, turns: int, max_tokens: int) -> list[Turn]:
    """The session's turns, grown with the answers LMDeploy gives through `client_base` (untimed)."""
    session = AgentSession("openwebui", model, max_tokens=max_tokens)
    out: list[Turn] = []
    turn = session.first_turn()
    async with httpx.AsyncClient(timeout=600.0, trust_env=False) as client:
        for i in range(turns):
            body = with_nonce(turn.body, "record")
            wire = _direct_body(body, None)
            got = await stream_request(client, client_base, "chat", "/v1/chat/completions", {}, wire)
            out.append(turn)
            if i + 1 < turns:
                turn = session.next_turn(got.text)
    return out


async def run_pass(path: str, turns: Sequence[Turn], rows: list[TurnSplit], urls: dict[str, str],
                   prompter: Prompter, block: int) -> None:  # fmt: skip
    """One pass over the turns by `path`, its own nonce; the ids pass also times each turn's fresh baseline."""
    nonce = secrets.token_hex(4)
    previous: list[int] = []
    base = urls["gateway" if path == "gateway" else "lmdeploy"]
    async with httpx.AsyncClient(timeout=600.0, trust_env=False) as client:
        for turn, row in zip(turns, rows, strict=True):
            body = with_nonce(turn.body, nonce) | {"max_tokens": 4}  # the first content chunk: a token may decode empty
            ids, template_ms, encode_ms = prompter.ids(body)
            row.prompt_tokens, row.uncached_tokens = len(ids), uncached_count(ids, previous, block)
            row.template_ms.append(template_ms)
            row.encode_ms.append(encode_ms)
            wire = body if path == "gateway" else _direct_body(body, ids if path == "ids" else None)
            got = await stream_request(client, base, "chat", "/v1/chat/completions", {}, wire)
            if got.ttft_s is not None:
                row.ttft_ms.setdefault(path, []).append(got.ttft_s * 1000)
            if got.error:
                print(f"{path} turn {turn.index + 1}: {got.error}", file=sys.stderr)
            row.reported_prompt_tokens.setdefault(path, []).append(got.prompt_tokens or 0)
            row.reported_cached_tokens.setdefault(path, []).append(got.cached_tokens)
            if path == "ids" and turn.index > 0:
                fresh = [random.randrange(1000, 30000) for _ in range(row.uncached_tokens)]
                got = await stream_request(client, base, "chat", "/v1/chat/completions", {},
                                           _direct_body(body, fresh))  # fmt: skip
                if got.ttft_s is not None:
                    row.fresh_ttft_ms.append(got.ttft_s * 1000)
            previous = ids


async def run(args: argparse.Namespace) -> list[TurnSplit]:
    prompter = Prompter(args.model_path)
    urls = {"lmdeploy": args.lmdeploy_url, "gateway": args.gateway_url}
    turns = await record_turns(args.lmdeploy_url, args.model, args.turns, args.max_tokens)
    rows = [TurnSplit(t.index) for t in turns]
    for path in PASSES:
        if path == "gateway" and not args.gateway_url:
            continue
        await run_pass(path, turns, rows, urls, prompter, args.block)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="the HF folder LMDeploy serves (its template and tokenizer)")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--lmdeploy-url", required=True, help="LMDeploy's api_server, e.g. http://127.0.0.1:PORT")
    p.add_argument("--gateway-url", default="", help="voltgate in front of it (the gateway path); empty: left out")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32, help="each recorded answer's length")
    p.add_argument("--block", type=int, default=64, help="TurboMind's cache block (cache_block_seq_len)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rows = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tm-turn-split.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    table = split_table(rows)
    (args.out / "tm-turn-split.md").write_text(f"# TurboMind: a cached turn's time to first token, split\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
