"""What an agent's cached turn costs besides prefilling its new tokens (issue 41's 1.5x goal), on the CPU.

`bench.session_replay` holds a cached turn's TTFT to a one-turn prompt of the turn's new text alone, and on the
GPU machine a cached turn takes 2-4x that. Here each turn's request (`bench.sessions`, the recorded Claude Code,
Codex and Open WebUI sessions, grown with a fixed short answer) is sent once, then `--repeats` more times: a
repeat finds its whole prompt but the last token in its slot, so its TTFT is what the turn costs besides
prefill (the gateway's parsing and translation, the worker's chat-template rendering and tokenization of the
whole conversation and its tools, the prefix match, one token attending over the whole context, the first
token's way back). The one-turn request of the turn's new text is sent the same way; its repeats are those
costs for a short request. Their difference is what the session's size adds to every turn.

With `--py-spy PATH`, py-spy samples the gateway and its worker while the last turn's request repeats
(`--profile-repeats` times) and the table lists where their CPU time went (the frames under which samples fell).

    python -m bench.turn_overhead --out bench/results/DATE-turn-overhead [--py-spy /tmp/pyspy/bin/py-spy]
    python -m bench.turn_overhead --config bench/gpu/configs/session-gguf-7b.yaml --out DIR   # GPU (`turns:gguf`)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import provenance
from bench.launch import Served, default_model_path, gateway_config, llamacpp_model_entry, start_gateway
from bench.processes import free_port
from bench.session_replay import Streamed, start_config_gateways, stream_request
from bench.sessions import SESSION_KINDS, AgentSession, SessionKind, Turn, one_turn_body

MODEL = "smollm2-135m"
ANSWER = "Done. Next step."
# The frames a profile is summed under (a sample counts once under each of these its stack passed through; a
# frame matches when its qualified name contains the text).
PROFILE_FRAMES = (
    "PromptBuilder.prepare", "Model.tokenize", "SchemaConverter", "ChatTemplate", "Sampler.__init__",
    "HostPrompts", "pick_slot", "Model.decode", "to_chat", "model_validate", "model_dump", "Upstream",
)  # fmt: skip
SAMPLE_RATE = 200


@dataclass
class TurnCost:
    kind: str
    turn: int
    prompt_tokens: int | None
    cached_tokens: int | None
    first_ttft_ms: float | None
    repeat_ttft_ms: float | None  # median of the repeats
    one_turn_prompt_tokens: int | None
    one_turn_repeat_ttft_ms: float | None

    @property
    def added_ms(self) -> float | None:
        if self.repeat_ttft_ms is None or self.one_turn_repeat_ttft_ms is None:
            return None
        return self.repeat_ttft_ms - self.one_turn_repeat_ttft_ms


@dataclass
class Sends:
    """One request sent once and then `repeats` times: the first send's TTFT, the repeats' median (ms), and the
    last send (its usage: the prompt as a repeat finds it)."""

    first_ms: float | None
    repeat_ms: float | None
    last: Streamed


async def _timed(client: httpx.AsyncClient, base: str, turn: Turn, body: dict[str, Any], repeats: int) -> Sends:
    last = await stream_request(client, base, turn.api, turn.path, turn.headers, body)
    first_ms = None if last.ttft_s is None else last.ttft_s * 1000
    ttfts = []
    for _ in range(repeats):
        last = await stream_request(client, base, turn.api, turn.path, turn.headers, body)
        if last.ttft_s is not None:
            ttfts.append(last.ttft_s * 1000)
    return Sends(first_ms, statistics.median(ttfts) if ttfts else None, last)


async def measure_kind(base: str, model: str, kind: SessionKind, turns: int, repeats: int) -> list[TurnCost]:
    session = AgentSession(kind, model, max_tokens=4)
    costs = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), trust_env=False) as client:
        turn = session.first_turn()
        for i in range(turns):
            sent = await _timed(client, base, turn, turn.body, repeats)
            one = await _timed(client, base, turn, one_turn_body(turn.api, model, turn.new_text, 4), repeats)
            costs.append(TurnCost(kind, i + 1, sent.last.prompt_tokens, sent.last.cached_tokens, sent.first_ms,
                                  sent.repeat_ms, one.last.prompt_tokens, one.repeat_ms))  # fmt: skip
            if i + 1 < turns:
                turn = session.next_turn(ANSWER)
    return costs


def _worker_pid(gateway_pid: int) -> int | None:
    for child in psutil.Process(gateway_pid).children(recursive=True):
        if "backends.llamacpp.worker" in " ".join(child.cmdline()):
            return int(child.pid)
    return None


def _summarise(raw: Path, requests: int) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks: CPU ms per request in all, and under each of `PROFILE_FRAMES`."""
    total, under, leaves = 0, Counter[str](), Counter[str]()
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        total += count
        frames = [frame.split(" ")[0] for frame in stack.split(";")]
        for name in PROFILE_FRAMES:
            if any(name in frame for frame in frames):
                under[name] += count
        leaves[frames[-1]] += count
    per = 1000 / SAMPLE_RATE / max(1, requests)
    under_ms = {k: v * per for k, v in under.most_common()}
    return {
        "samples": total,
        "ms_per_request": total * per,
        "under_ms": under_ms,
        "leaves": dict(leaves.most_common(12)),
    }


async def _send(base: str, turn: Turn, times: int) -> float:
    """Send `turn` `times` times, one after another; the seconds it took."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), trust_env=False) as client:
        started = time.perf_counter()
        for _ in range(times):
            await stream_request(client, base, turn.api, turn.path, turn.headers, turn.body)
        return time.perf_counter() - started


def _spy(py_spy: str, pid: int, path: Path) -> subprocess.Popen[bytes]:
    argv = [py_spy, "record", "-p", str(pid), "-r", str(SAMPLE_RATE), "-f", "raw", "-o", str(path), "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_last_turn(served: Served, kind: SessionKind, turns: int, repeats: int, py_spy: str, out: Path) -> dict[
        str, Any]:  # fmt: skip
    """The session grown to its last turn and prefilled, then py-spy on the gateway and the worker while it
    repeats `repeats` times."""
    session = AgentSession(kind, served.model, max_tokens=4)
    turn = session.first_turn()
    for _ in range(turns - 1):
        turn = session.next_turn(ANSWER)
    asyncio.run(_send(served.root_url, turn, 1))
    pids = {"gateway": served.pid, "worker": _worker_pid(served.pid)}
    paths = {name: out / f"profile-{kind}-{name}.txt" for name in pids}
    spies = {name: _spy(py_spy, pid, paths[name]) for name, pid in pids.items() if pid is not None}
    time.sleep(1.0)
    elapsed = asyncio.run(_send(served.root_url, turn, repeats))
    for spy in spies.values():
        spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
        spy.wait(60)
    found = {name: _summarise(paths[name], repeats) for name in spies}
    return {"kind": kind, "turn": turns, "repeats": repeats, "seconds": elapsed, "processes": found}


HEADER = (
    "| session | turn | prompt tokens | cached on repeat | TTFT first ms | TTFT repeat ms (median) | one-turn tokens "
    "| one-turn repeat ms | added by the session ms |"
)


def _row(c: TurnCost) -> str:
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f}"

    cells = [c.kind, str(c.turn), str(c.prompt_tokens or "-"), str(c.cached_tokens or "-"), fmt(c.first_ttft_ms),
             fmt(c.repeat_ttft_ms), str(c.one_turn_prompt_tokens or "-"), fmt(c.one_turn_repeat_ttft_ms),
             fmt(c.added_ms)]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def write_results(
    out: Path, meta: dict[str, Any], costs: Sequence[TurnCost], profiles: Sequence[dict[str, Any]]
) -> None:
    where = f"`{meta['config']}`" if meta.get("config") else "CPU, the embedded model"
    lines = [f"# What a cached turn costs besides its new tokens ({where})", "", HEADER, "|---" * 9 + "|"]
    lines += [_row(c) for c in costs]
    for p in profiles:
        lines += ["", f"## Profile: {p['kind']}, turn {p['turn']}, {p['repeats']} repeats in {p['seconds']:.2f} s", ""]
        for name, found in p["processes"].items():
            under = ", ".join(f"`{k}` {v:.1f}" for k, v in found["under_ms"].items())
            lines.append(f"- **{name}**: {found['ms_per_request']:.1f} CPU ms a request (py-spy, {SAMPLE_RATE}/s, "
                         f"{found['samples']} samples); of it under {under or '-'}")  # fmt: skip
    (out / "turn-overhead.md").write_text("\n".join(lines) + "\n")
    data = {"meta": meta, "turns": [asdict(c) | {"added_ms": c.added_ms} for c in costs], "profiles": list(profiles)}
    (out / "turn-overhead.json").write_text(json.dumps(data, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.turn_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kinds", nargs="+", default=list(SESSION_KINDS), choices=SESSION_KINDS)
    p.add_argument("--py-spy", default=None, help="py-spy binary: profile the last turn's repeats")
    p.add_argument("--profile-repeats", type=int, default=30)
    p.add_argument("--config", type=Path, default=None, help="a gateway config (its first model, GPUs on) instead "
                   "of the embedded model on the CPU: the GPU machine's `turns:gguf` step")  # fmt: skip
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.config is not None:
        served = start_config_gateways({"on": args.config}, args.out / "logs")["on"]
    else:
        entry = llamacpp_model_entry(MODEL, default_model_path(), context=16384, concurrency=2, slots=2,
                                     n_threads=args.threads)  # fmt: skip
        served = start_gateway("gateway", gateway_config(free_port(), [entry]), log_dir=args.out / "logs")
    costs: list[TurnCost] = []
    profiles: list[dict[str, Any]] = []
    try:
        for kind in args.kinds:
            costs += asyncio.run(measure_kind(served.root_url, served.model, kind, args.turns, args.repeats))
            if args.py_spy:
                profiles.append(
                    profile_last_turn(served, kind, args.turns, args.profile_repeats, args.py_spy, args.out)
                )
    finally:
        served.stop()
    meta = provenance.collect(threads=args.threads, turns=args.turns, config=str(args.config or ""))
    write_results(args.out, meta, costs, profiles)
    print((args.out / "turn-overhead.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
