"""Session replay: multi-turn agent sessions against a gateway, prefix caching on vs off, per turn.

The sessions (`bench.sessions`) are Claude Code via `/v1/messages`, Codex via `/v1/responses` and an Open WebUI
chat with its title/tag/follow-up tasks interleaved, grown to `--turns` turns from the recorded fixtures, each
turn the previous prompt plus the model's real answer and a tool result or user message. Per turn it reports
prompt tokens, cached tokens (from the usage each API returns: chat `prompt_tokens_details.cached_tokens`,
Responses `input_tokens_details.cached_tokens`, Messages `cache_read_input_tokens`; "-" when the API left it
out), TTFT, and the TTFT of two one-turn prompts: the turn's new text alone, and a prompt of as many tokens as the
turn prefilled (`bench.session_results` says why both); per session the total time.

Caching off: a second gateway with the worker's host prompt cache off (`prompt_cache_mib: 0`), and before each
request every slot overwritten by short unrelated prompts (untimed), since the worker has no switch for prefix
reuse in its slots. It replays the very requests the caching-on session sent (answers included), but only the
turns `--off-turns` names, since each is a full prefill. The two modes alternate ABBA per session kind; with
`--gpu` one gateway runs at a time (on for every kind, then off: each sees a V100's memory alone). The
goal it checks: from the second turn on, >= 90 % of each prompt from cache, and TTFT within 1.5x of the
one-turn prompt of the new text.

    python -m bench.session_replay --out bench/results/DATE-session-replay          # CPU, embedded SmolLM2
    python -m bench.session_replay --gpu --config GW.yaml --off-config GW_OFF.yaml --model NAME --out DIR
    python -m bench.session_replay --base-url http://127.0.0.1:8080 --model NAME --kinds openwebui --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import provenance
from bench.launch import (
    BENCH_API_KEY,
    Served,
    default_model_path,
    gateway_config,
    llamacpp_model_entry,
    start_gateway,
)
from bench.loadgen import make_prompt
from bench.processes import free_port
from bench.session_results import DERIVED, SessionResult, TurnResult, goal_summary, session_table
from bench.sessions import SESSION_KINDS, AgentSession, Api, SessionKind, Turn, background_tasks, one_turn_body

MODEL = "smollm2-135m"


@dataclass
class Streamed:
    """What one streamed request gave: text, first-token time, usage as the API reported it."""

    text: str = ""
    ttft_s: float | None = None
    total_s: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


def _usage(api: Api, event: dict[str, Any], out: Streamed) -> None:
    """Prompt and cached tokens from a usage-bearing event of `api`'s stream."""
    if api == "chat":
        usage = event.get("usage")
        if isinstance(usage, dict):
            out.prompt_tokens = usage.get("prompt_tokens")
            out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    elif api == "responses" and event.get("type") in ("response.completed", "response.incomplete"):
        usage = event["response"].get("usage") or {}
        out.prompt_tokens = usage.get("input_tokens")
        out.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    elif api == "messages" and event.get("type") in ("message_start", "message_delta"):
        usage = (event.get("message") or {}).get("usage") or event.get("usage") or {}
        if "input_tokens" in usage:
            read = usage.get("cache_read_input_tokens")
            out.cached_tokens = read
            out.prompt_tokens = usage["input_tokens"] + (read or 0) + (usage.get("cache_creation_input_tokens") or 0)


def _delta_text(api: Api, event: dict[str, Any]) -> str | None:
    """The generated text (or tool-call arguments, as '') an event carries; None for other events."""
    if api == "chat":
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls"):
                return str(delta.get("content") or "")
        return None
    kind = event.get("type")
    if api == "responses" and kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        return str(event.get("delta") or "") if kind == "response.output_text.delta" else ""
    if api == "messages" and kind == "content_block_delta":
        return str((event.get("delta") or {}).get("text") or "")
    return None


async def stream_request(
    client: httpx.AsyncClient, base: str, api: Api, path: str, headers: dict[str, str], body: dict[str, Any]
) -> Streamed:
    """POST a streaming request and time it; never raises for HTTP or stream failures."""
    out = Streamed()
    auth = {"authorization": f"Bearer {BENCH_API_KEY}", "x-api-key": BENCH_API_KEY, "anthropic-version": "2023-06-01"}
    start = time.perf_counter()
    try:
        async with client.stream("POST", base + path, json=body, headers={**headers, **auth}) as response:
            if response.status_code != 200:
                out.error = f"http_{response.status_code}: {(await response.aread())[:200]!r}"
                return out
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() in ("", "[DONE]"):
                    continue
                event = json.loads(line[5:])
                if "error" in event and event.get("type") in (None, "error"):
                    out.error = f"stream error: {str(event['error'])[:200]}"
                text = _delta_text(api, event)
                if text is not None:
                    out.ttft_s = out.ttft_s or time.perf_counter() - start
                    out.text += text
                _usage(api, event, out)
    except httpx.HTTPError as exc:
        out.error = type(exc).__name__
    out.total_s = time.perf_counter() - start
    return out


async def flush_slots(client: httpx.AsyncClient, base: str, model: str, slots: int, seed: int) -> None:
    """Overwrite every slot with a short unrelated prompt. They are sent together and each generates 32 tokens,
    so all are in flight at once and each must take its own slot (a free slot goes first to an empty one, so
    one request at a time would never reach the slot holding the session). The cached tokens the next turn
    reports show whether it worked."""
    bodies = [
        {
            "model": model,
            "prompt": make_prompt(24, seed * 100 + i),
            "max_tokens": 32,
            "ignore_eos": True,
            "stream": True,
        }
        for i in range(slots)
    ]
    await asyncio.gather(*(stream_request(client, base, "chat", "/v1/completions", {}, b) for b in bodies))


@dataclass(frozen=True)
class ReplaySpec:
    """How to replay: turns per session, answer length, slots to flush for caching off."""

    turns: int = 8
    max_tokens: int = 32
    task_max_tokens: int = 32
    slots: int = 4
    model: str = MODEL
    volatile_billing: bool = True


async def run_session(base: str, kind: SessionKind, rep: int, spec: ReplaySpec) -> tuple[SessionResult, list[Turn]]:
    """One session of `spec.turns` turns with caching on, then the one-turn prompts of each turn's new text;
    the result and the turns it sent (for `replay_uncached`)."""
    session = AgentSession(kind, spec.model, max_tokens=spec.max_tokens, volatile_billing=spec.volatile_billing)
    result = SessionResult(kind, "on", rep, 0.0)
    turns: list[Turn] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0, connect=10.0), trust_env=False) as client:
        start = time.perf_counter()
        turn = session.first_turn()
        for i in range(spec.turns):
            got = await stream_request(client, base, turn.api, turn.path, turn.headers, turn.body)
            turns.append(turn)
            result.turns.append(TurnResult(i, got.prompt_tokens, got.cached_tokens, got.ttft_s, error=got.error))
            if kind == "openwebui":
                await _background(client, base, i, [*turn.body["messages"], {"role": "assistant", "content": got.text}],
                                  spec)  # fmt: skip
            if i + 1 < spec.turns:
                turn = session.next_turn(got.text)
        result.total_s = time.perf_counter() - start
        for turn, row in zip(turns[1:], result.turns[1:], strict=True):
            body = one_turn_body(turn.api, spec.model, turn.new_text, 1)
            got = await stream_request(client, base, turn.api, turn.path, turn.headers, body)
            row.one_turn_ttft_s, row.one_turn_prompt_tokens = got.ttft_s, got.prompt_tokens
            if row.new_tokens and got.prompt_tokens:
                same = await same_count(client, base, turn, spec.model, row.new_tokens, got.prompt_tokens)
                row.same_count_ttft_s, row.same_count_prompt_tokens = same.ttft_s, same.prompt_tokens
    return result, turns


async def same_count(
    client: httpx.AsyncClient, base: str, turn: Turn, model: str, count: int, text_tokens: int
) -> Streamed:
    """A one-turn request of about `count` prompt tokens (`bench.session_results`): a tag, the turn's new text and
    `count - text_tokens` filler words. The tag leads with a random nonce, so a try shares no more than the
    template's head with any prompt before it (another session's baseline of the same text included). Up to three
    tries, each corrected by the last one's miss, until within 5 %; where the text alone is longer than `count`,
    the text alone (its token count is reported beside its TTFT)."""
    extra = count - text_tokens
    got = Streamed()
    nonce = secrets.token_hex(3)
    for attempt in range(3):
        text = f"[{nonce} {turn.index}.{attempt} baseline] {turn.new_text}" + " a" * max(0, extra)
        body = one_turn_body(turn.api, model, text, 1)
        got = await stream_request(client, base, turn.api, turn.path, turn.headers, body)
        if got.prompt_tokens is None or abs(count - got.prompt_tokens) <= max(2, count // 20):
            break
        if extra <= 0 and got.prompt_tokens > count:  # the text alone is longer: no filler to take away
            break
        extra += count - got.prompt_tokens
    return got


async def _background(
    client: httpx.AsyncClient, base: str, turn: int, history: list[dict[str, Any]], spec: ReplaySpec
) -> None:
    """Open WebUI's title/tags/follow-up tasks after an answer (timed as part of the session, not the turn)."""
    for _, prompt in background_tasks(turn, history):
        task = {"model": spec.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": spec.task_max_tokens, "stream": True}  # fmt: skip
        await stream_request(client, base, "chat", "/v1/chat/completions", {}, task)


async def replay_uncached(
    base: str, kind: SessionKind, rep: int, turns: Sequence[Turn], indices: Sequence[int], spec: ReplaySpec
) -> SessionResult:
    """The same requests a caching-on session sent (its answers included), caching off: every slot overwritten
    before each one. Only `indices` (0-based turns) are sent: each costs a full prefill here. `total_s` is the
    sum of their end-to-end times."""
    result = SessionResult(kind, "off", rep, 0.0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0, connect=10.0), trust_env=False) as client:
        for i in indices:
            turn = turns[i]
            await flush_slots(client, base, spec.model, spec.slots, seed=rep * 1000 + i)
            got = await stream_request(client, base, turn.api, turn.path, turn.headers, turn.body)
            result.turns.append(TurnResult(i, got.prompt_tokens, got.cached_tokens, got.ttft_s, error=got.error))
            result.total_s += got.total_s
    return result


def model_entry(model_path: Path, *, prompt_cache_mib: int, slots: int, threads: int) -> dict[str, Any]:
    entry = llamacpp_model_entry(MODEL, model_path, context=8192, concurrency=slots, slots=slots, n_threads=threads)
    entry["llamacpp"] |= {"prompt_cache_mib": prompt_cache_mib, "cache_type": "f16", "max_queue": 64}
    return entry


def start_cpu_gateways(log_dir: Path, slots: int, threads: int) -> dict[str, Served]:
    """Two gateways on the embedded SmolLM2: prefix caching as shipped (on), and off."""
    path = default_model_path()
    served = {}
    for cache, mib in (("on", 2048), ("off", 0)):
        config = gateway_config(free_port(), [model_entry(path, prompt_cache_mib=mib, slots=slots, threads=threads)])
        served[cache] = start_gateway(f"gateway-cache-{cache}", config, log_dir=log_dir)
    return served


def start_config_gateways(configs: dict[str, Path], log_dir: Path) -> dict[str, Served]:
    """Gateways from config files (the GPU mode): each file's models, on a free port, `--gpus` from the file."""
    served = {}
    for cache, path in configs.items():
        config = yaml.safe_load(path.read_text())
        config["server"] = {**config.get("server", {}), "host": "127.0.0.1", "port": free_port()}
        served[cache] = start_gateway(f"gateway-cache-{cache}", config, log_dir=log_dir, timeout_s=900, gpus=True)
    return served


def abba(reps: int) -> list[tuple[int, str]]:
    """(rep, cache) in ABBA order: on, off, off, on, on, off, ..."""
    order = []
    for rep in range(reps):
        pair = ("on", "off") if rep % 2 == 0 else ("off", "on")
        order += [(rep, cache) for cache in pair]
    return order


def run_kind(
    targets: dict[str, str],
    kind: SessionKind,
    reps: int,
    off_turns: Sequence[int],
    spec: ReplaySpec,
    save: Callable[[SessionResult], None],
) -> None:
    """One kind of session, caching on and off in ABBA order, each result handed to `save` as it ends. An off
    run replays the last on run's requests (the first rep's, when it comes first), so both modes send
    identical prompts."""
    sent: list[Turn] = []
    pending_off: list[int] = []

    def done(result: SessionResult) -> None:
        save(result)
        print("\n".join(session_table(result)) + "\n", file=sys.stderr, flush=True)

    for rep, cache in abba(reps):
        if cache == "on" and "on" in targets:
            result, sent = asyncio.run(run_session(targets["on"], kind, rep, spec))
            done(result)
            for off_rep in pending_off:  # an off run that came first in its pair, now that prompts exist
                done(asyncio.run(replay_uncached(targets["off"], kind, off_rep, sent, off_turns, spec)))
            pending_off = []
        elif cache == "off" and "off" in targets and off_turns:
            if sent:
                done(asyncio.run(replay_uncached(targets["off"], kind, rep, sent, off_turns, spec)))
            else:
                pending_off.append(rep)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.session_replay", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for session-replay.json/.md and logs")
    p.add_argument("--merge", type=Path, nargs="+", help="only merge these runs' folders into --out's table")
    p.add_argument("--kinds", nargs="+", choices=SESSION_KINDS, default=list(SESSION_KINDS))
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--reps", type=int, default=2, help="repetitions of each (kind, caching), ABBA order")
    p.add_argument(
        "--off-turns",
        type=int,
        nargs="*",
        default=[2],
        help="turns (1-based) replayed with caching off: each is a full prefill (default: 2)",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="answer length per turn")
    p.add_argument("--task-max-tokens", type=int, default=32, help="Open WebUI's background tasks' max_tokens")
    p.add_argument("--slots", type=int, default=4, help="worker slots (CPU mode; the default config's 4)")
    p.add_argument("--threads", type=int, default=2, help="worker CPU threads (CPU mode)")
    p.add_argument("--stable-billing", action="store_true", help="keep Claude Code's billing header fixed")
    p.add_argument("--gpu", action="store_true", help="start gateways from --config/--off-config (GPU machine)")
    p.add_argument("--config", type=Path, help="--gpu: gateway config with caching on")
    p.add_argument("--off-config", type=Path, help="--gpu: the same with caching off")
    p.add_argument("--base-url", help="replay against this running server instead (caching as it is: 'on')")
    p.add_argument("--model", default=MODEL)
    return p


def _targets(args: argparse.Namespace, log_dir: Path) -> tuple[dict[str, str], list[Served]]:
    if args.base_url:
        return {"on": args.base_url.rstrip("/").removesuffix("/v1")}, []
    served = start_cpu_gateways(log_dir, args.slots, args.threads)
    return {cache: s.root_url for cache, s in served.items()}, list(served.values())


def run_gpu(
    args: argparse.Namespace, spec: ReplaySpec, off_turns: Sequence[int], save: Callable[[SessionResult], None]
) -> None:
    """The GPU mode: one gateway on the GPU at a time, so each sees the memory a V100 would give it alone. Every
    kind with caching on first (its requests kept), then the caching-off gateway replays those requests; one rep
    (on, then off: two engine starts, not one per kind)."""
    if not args.config:
        raise SystemExit("--gpu needs --config (and --off-config for the caching-off column)")
    sent: dict[str, list[Turn]] = {}
    for cache, path in (("on", args.config), ("off", args.off_config)):
        if path is None:
            continue
        served = start_config_gateways({cache: path}, args.out / "logs")[cache]
        try:
            for kind in args.kinds:
                if cache == "on":
                    result, sent[kind] = asyncio.run(run_session(served.root_url, kind, 0, spec))
                elif sent.get(kind) and off_turns:
                    result = asyncio.run(replay_uncached(served.root_url, kind, 0, sent[kind], off_turns, spec))
                else:
                    continue
                save(result)
                print("\n".join(session_table(result)) + "\n", file=sys.stderr, flush=True)
        finally:
            served.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        return merge(args.merge, args.out)
    spec = ReplaySpec(args.turns, args.max_tokens, args.task_max_tokens, slots=args.slots, model=args.model,
                      volatile_billing=not args.stable_billing)  # fmt: skip
    meta = provenance.collect(notes="bench.session_replay")
    results: list[SessionResult] = []
    off_turns = sorted({min(t, args.turns) - 1 for t in args.off_turns})

    def save(result: SessionResult) -> None:  # after every session: an interrupted run keeps what it measured
        results.append(result)
        write_results(args.out, meta, spec, results)

    if args.gpu:
        run_gpu(args, spec, off_turns, save)
        print("\n".join(goal_summary(results)))
        return 0 if results and all(t.error is None for r in results for t in r.turns) else 1
    targets, served = _targets(args, args.out / "logs")
    try:
        for kind in args.kinds:
            run_kind(targets, kind, args.reps, off_turns, spec, save)
    finally:
        for s in served:
            s.stop()
    print("\n".join(goal_summary(results)))
    return 0 if results and all(t.error is None for r in results for t in r.turns) else 1


def merge(folders: Sequence[Path], out: Path) -> int:
    """One table from several runs (e.g. one process per session kind): their sessions, in the order given."""
    runs = [json.loads((f / "session-replay.json").read_text()) for f in folders]
    results = []
    for run in runs:
        for data in run["sessions"]:
            turns = [TurnResult(**{k: v for k, v in t.items() if k not in DERIVED})
                     for t in data["turns"]]  # fmt: skip
            results.append(SessionResult(data["kind"], data["cache"], data["rep"], data["total_s"], turns,
                                         data["cached_source"]))  # fmt: skip
    meta = {"merged": [str(f) for f in folders], "runs": [run["meta"] for run in runs]}
    write_results(out, meta, ReplaySpec(**runs[0]["spec"]), results)
    print("\n".join(goal_summary(results)))
    return 0


def write_results(out: Path, meta: dict[str, Any], spec: ReplaySpec, results: Sequence[SessionResult]) -> None:
    """`session-replay.md` (the goal summary, then every session's turns) and `session-replay.json`."""
    lines = ["# Session replay", "", *goal_summary(results), ""]
    for r in results:
        lines += [*session_table(r), ""]
    (out / "session-replay.md").write_text("\n".join(lines))
    data = {"meta": meta, "spec": asdict(spec), "sessions": [r.to_json() for r in results]}
    (out / "session-replay.json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
