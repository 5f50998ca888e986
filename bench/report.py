"""Markdown rendering of bench results: tables for overhead and batching, and the suite's summary.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(value: Any, digits: int = 1, *, pct: bool = False) -> str:
    """A number for a table: fixed digits, thousands separators, '-' when missing."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if pct:
            return f"{value * 100:.{digits}f}%"
        return f"{value:,.{digits}f}"
    return str(value)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; cells are str()-ed, pipes escaped."""

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def overhead_tables(result: dict[str, Any]) -> str:
    """The gateway-overhead section: headline figures, the issue's goals, then per-upstream detail."""
    h = result.get("headline") or {}
    goals = h.get("goals") or {}
    cpu = h.get("cpu_s_per_1k_chunks") or {}
    ttft = h.get("added_ttft_ms") or {}
    tput = h.get("throughput_ratio_real") or {}
    chunks = h.get("chunks_per_s_zero_c8") or {}

    def row(label: str, table: dict[str, Any], key: str, digits: int) -> list[str]:
        gw, fl = _get(table, "gateway", key), _get(table, "floor", key)
        return [label, fmt(gw, digits), fmt(fl, digits)]

    def ttft_row(label: str, key: str) -> list[str]:
        cells = []
        for r in ("gateway", "floor"):
            ci = _get(ttft, r, key + "_paired_ci95")
            ci_s = f", 95% CI {ci[0]:.2f} to {ci[1]:.2f}" if ci else ""
            cells.append(f"{fmt(_get(ttft, r, key), 2)} ({fmt(_get(ttft, r, key + '_paired'), 2)}{ci_s})")
        return [label, *cells]

    out = [f"Pinning: {result.get('pinning', '-')}.", ""]
    out.append(
        md_table(
            ["measure", "gateway (auth + metrics on)", "floor (bare relay)"],
            [
                row("relay CPU-s per 1k streamed chunks: zero upstream, paced 1 ms, c=16", cpu, "zero_paced", 3),
                row("relay CPU-s per 1k streamed chunks: zero upstream, instant, c=8", cpu, "zero_instant_c8", 3),
                row("relay CPU-s per 1k streamed chunks: real worker, c=8", cpu, "real_c8", 3),
                ttft_row("added TTFT at c=1, zero upstream: ms, median diff (paired diff, its 95% CI)", "zero"),
                ttft_row("added TTFT at c=1, real worker: ms, median diff (paired diff, its 95% CI)", "real"),
                row("output tok/s, fraction of direct: real worker, c=1", tput, "c1", 3),
                row("output tok/s, fraction of direct: real worker, c=8", tput, "c8", 3),
                [
                    f"chunks/s through the relay: zero upstream, instant, c=8 (direct: {fmt(chunks.get('direct'), 0)})",
                    fmt(chunks.get("gateway"), 0),
                    fmt(chunks.get("floor"), 0),
                ],
            ],
        )
    )
    tput_gw = tput.get("gateway") or {}
    ci = goals.get("added_ttft_ci95")
    ttft_ci = f"; 95% CI {ci[0]:.2f} to {ci[1]:.2f}" if ci else ""
    out += [
        "",
        md_table(
            ["issue 7 goal (gateway)", "measured", "met"],
            [
                [
                    f"≤ {goals.get('cpu_s_per_1k_chunks_max')} CPU-s per 1k streamed chunks",
                    f"{fmt(goals.get('cpu_judged_on'), 3)} ({goals.get('cpu_source') or '-'})",
                    fmt(goals.get("cpu_met")),
                ],
                [
                    f"≤ {goals.get('added_ttft_ms_max')} ms added TTFT, unloaded",
                    f"{fmt(goals.get('added_ttft_judged_on'), 2)} ({goals.get('added_ttft_source') or '-'}{ttft_ci})",
                    fmt(goals.get("added_ttft_met")),
                ],
                [
                    f"≥ {goals.get('throughput_ratio_min')} of direct throughput at c=1 and c=8 (real worker)",
                    f"{fmt(tput_gw.get('c1'), 3)} / {fmt(tput_gw.get('c8'), 3)}",
                    fmt(goals.get("throughput_ratio_met")),
                ],
            ],
        ),
    ]
    for key, title in (
        ("real_worker", "Real llama.cpp worker"),
        ("zero_upstream", "Zero-latency upstream"),
        ("zero_paced", "Zero-latency upstream, paced"),
    ):
        part = result.get(key)
        if not part:
            continue
        rows = []
        for level, paths in (part.get("throughput") or {}).items():
            for label, r in paths.items():
                s = r["summary"]
                rows.append(
                    [
                        level,
                        label,
                        fmt(s.get("output_throughput")),
                        fmt(s.get("chunk_throughput"), 0),
                        fmt(r.get("output_throughput_ratio_to_direct"), 3),
                        fmt(_get(s, "ttft_ms", "p50"), 2),
                        fmt(_get(s, "itl_ms", "p50"), 2),
                        fmt(r.get("relay_cpu_s"), 2),
                        fmt(r.get("relay_cpu_s_per_1k_chunks"), 3),
                        f"{s.get('completed', '-')}/{s.get('requests', '-')}",
                    ]
                )
        out += ["", f"**{title}**: {part.get('upstream', '')}", ""]
        if part.get("gateway_skipped"):
            out += [f"Gateway path not measured: {part['gateway_skipped']}", ""]
        out.append(
            md_table(
                [
                    "load",
                    "path",
                    "out tok/s",
                    "chunks/s",
                    "vs direct",
                    "TTFT p50 ms",
                    "ITL p50 ms",
                    "relay CPU-s",
                    "CPU-s/1k chunks",
                    "ok",
                ],
                rows,
            )
        )
        ttft_c1 = part.get("ttft_c1")
        if ttft_c1:
            out += [
                "",
                md_table(
                    [
                        "path (c=1, one request at a time)",
                        "TTFT p50 ms",
                        "TTFT p90 ms",
                        "added: median diff",
                        "added: paired diff",
                        "n",
                    ],
                    [
                        [
                            label,
                            fmt(t.get("ttft_ms_p50"), 2),
                            fmt(t.get("ttft_ms_p90"), 2),
                            fmt(t.get("added_ttft_ms_p50"), 2),
                            fmt(t.get("added_ttft_ms_paired_p50"), 2),
                            t.get("requests", "-"),
                        ]
                        for label, t in ttft_c1.items()
                    ],
                ),
            ]
    return "\n".join(out)


def batching_tables(result: dict[str, Any]) -> str:
    """The continuous-batching section: slots=N vs slots=1 per concurrency, then every series."""
    load = result.get("load") or {}
    rows = [
        [
            r["concurrency"],
            fmt(r["slots_one_tok_s"]),
            fmt(r["slots_many_tok_s"]),
            fmt(r["speedup"], 2) + "x",
            fmt(r["per_stream_decode_tok_s"]),
            fmt(r["per_stream_vs_single_stream"], 0, pct=True),
            fmt(r["ttft_ms_p50_one"], 0),
            fmt(r["ttft_ms_p50_many"], 0),
        ]
        for r in result.get("comparison", ())
    ]
    many = next((s["slots"] for s in result.get("series", ()) if s["slots"] > 1), "N")
    out = [
        f"Prompt ≈{load.get('prompt_words')} words, {load.get('output_tokens')} output tokens (ignore_eos), "
        f"requests per level {load.get('requests_per_level')}, worker threads: {load.get('n_threads')}.",
        "",
        md_table(
            [
                "concurrency",
                "1 slot: tok/s",
                f"{many} slots: tok/s",
                "speedup",
                f"{many} slots: per-stream decode tok/s",
                "vs single stream",
                "1 slot: TTFT p50 ms",
                f"{many} slots: TTFT p50 ms",
            ],
            rows,
        ),
        "",
    ]
    detail = []
    for s in result.get("series", ()):
        for lv in s["levels"]:
            m = lv["summary"]
            detail.append(
                [
                    s["label"],
                    lv["concurrency"],
                    fmt(m["output_throughput"]),
                    fmt(m["request_throughput"], 2),
                    fmt(m["ttft_ms"]["p50"], 0),
                    fmt(m["ttft_ms"]["p99"], 0),
                    fmt(m["itl_ms"]["p50"], 1),
                    fmt(m["itl_ms"]["p99"], 1),
                    fmt(m["e2e_ms"]["p50"], 0),
                    f"{m['completed']}/{m['requests']}",
                    ", ".join(f"{k}: {v}" for k, v in m["errors"].items()) or "-",
                ]
            )
    out.append(
        md_table(
            [
                "series",
                "c",
                "out tok/s",
                "req/s",
                "TTFT p50",
                "TTFT p99",
                "ITL p50",
                "ITL p99",
                "e2e p50",
                "ok",
                "errors",
            ],
            detail,
        )
    )
    out.append("\n(times in ms)")
    return "\n".join(out)


def hardware_line(meta: dict[str, Any]) -> str:
    hw = meta.get("hardware") or {}
    mem = hw.get("memory_bytes")
    gpus = ", ".join(g["name"] for g in hw.get("gpus") or ()) or "no GPU"
    mem_s = f"{mem / 2**30:.0f} GiB RAM" if mem else "RAM unknown"
    return f"{hw.get('cpu_model')}, {hw.get('cpu_count')} cores, {mem_s}, {gpus}; host `{hw.get('hostname')}`"


def model_line(shape: dict[str, Any] | None) -> str:
    if not shape:
        return "-"
    return (
        f"{shape.get('name')} ({shape.get('architecture')}, {shape.get('parameters', 0) / 1e6:.0f} M params, "
        f"{shape.get('block_count')} layers, d_model {shape.get('embedding_length')}, "
        f"{shape.get('attention_head_count')} heads / {shape.get('attention_head_count_kv')} KV heads; "
        f"tensors {shape.get('tensor_types')}; {shape.get('file_bytes', 0) / 2**20:.0f} MiB file)"
    )


BATCHING_NOTES = """\
The same worker program on the same GGUF, started with `--slots 1` and with `--slots 16` (and a gateway in
front of a third, 16-slot worker it manages); at each concurrency level every series is run in turn. Per-stream
decode speed = (output tokens - 1) / (e2e - TTFT), median over requests; "vs single stream" compares it with
the 16-slot worker at c=1. Workers run one llama.cpp thread: the other core is left to the load generator and
the gateway (with 2 threads on a shared 2-core VM, llama.cpp's spinning threads stall whenever anything else
runs)."""

OVERHEAD_NOTES = """\
Three paths to one upstream, hit in rotating order: **direct**, the **floor** (`bench/relay_floor.py`, a bare
Starlette + httpx passthrough) and the **gateway** (`voltgate serve`, API-key auth and metrics on). Relay
CPU-s per 1k chunks = user + system CPU of the relay's PID over its runs (psutil, before/after) / SSE chunks the
client received x 1000. Instant zero-upstream chunks coalesce into few TCP reads, which amortises per-read cost;
paced chunks (1 ms apart) reach the relay one read at a time, like real tokens; the real worker delivers only
~10-100 chunks/s, so each chunk also pays for waking an idle process. Added TTFT: one request at a time, paths
alternating request by request, each with its own prompt; median(path) - median(direct), and in brackets the
median of per-round differences."""


LIVE_SPEED_NOTES = (
    "`voltgate serve` on the model (context 4,096, 4 slots, one llama.cpp thread), 8 streamed chats of up to 128 "
    "tokens one at a time and then 4 at once through the openai SDK, then `GET /v1/placement`: the plan's "
    "prediction beside what the gateway measured (`gateway/ops/live_speed.py`) and what the client measured. The "
    "CPU prediction's constants come from the machine they were calibrated on (2026-11-29): on another CPU "
    "the ratio says how far off they are."
)


def live_speed_table(result: dict[str, Any]) -> str:
    """The predicted-against-measured table of summary.md."""
    prediction, measured = result.get("prediction") or {}, result.get("measured") or {}
    ratios = measured.get("ratio_to_predicted") or {}
    client = result.get("client_decode_tok_s_p50") or {}
    alone = (measured.get("decode_tok_s_single_stream") or {}).get("p50")
    per_stream = (measured.get("decode_tok_s_per_stream") or {}).get("p50")
    ttft = (measured.get("ttft_s") or {}).get("p50")
    rows = [
        "| | predicted | measured by the gateway (p50) | measured by the client (p50) | ratio |",
        "|---|---:|---:|---:|---:|",
        f"| decode tok/s, a stream alone | {prediction.get('decode_tok_s_1')} | {alone} | {client.get('alone')} "
        f"| {ratios.get('decode_single')} |",
        f"| decode tok/s per stream, every request | {prediction.get('decode_tok_s_per_stream')} at "
        f"{prediction.get('sessions')} streams | {per_stream} (mean {measured.get('mean_concurrent_streams')} "
        f"at once) | {next(iter(v for k, v in client.items() if k != 'alone'), None)} (all at once) "
        f"| {ratios.get('decode_per_stream')} |",
        f"| TTFT s | {prediction.get('ttft_s')} for 512 tokens | {ttft} for "
        f"{measured.get('mean_prompt_tokens')} ({measured.get('mean_cached_prompt_tokens')} cached) | | "
        f"{ratios.get('ttft')} |",
    ]
    return "\n".join(rows)


def suite_summary(suite: dict[str, Any]) -> str:
    """summary.md for a CPU suite run."""
    meta = suite["meta"]
    git = meta.get("git") or {}
    lines = [
        f"# voltgate CPU benchmarks — {suite['date']}",
        "",
        "Measured on 2 shared cores; ratios measured side by side (every path or series hit in rotating "
        "order within one run, so drift on a shared machine hits all alike). Absolute numbers are this "
        "machine's; compare ratios, not tokens/s, across machines.",
        "",
        f"- Hardware: {hardware_line(meta)}",
        f"- Model: {model_line(meta.get('model_shape'))}",
        f"- Git commit: `{git.get('commit')}`" + (" (with uncommitted changes)" if git.get("dirty") else ""),
        f"- Packages: {', '.join(f'{k} {v}' for k, v in (meta.get('packages') or {}).items())}",
        f"- Started (UTC): {meta.get('started_utc')}; wall time {fmt(suite.get('wall_s'), 0)} s "
        f"({', '.join(f'{k} {v:.0f} s' for k, v in (suite.get('stage_s') or {}).items())})",
        "",
        "## Commands",
        "",
        "```sh",
        "make bench   # = " + meta.get("command", ""),
        *suite.get("part_commands", ()),
        "```",
    ]
    if suite.get("batching"):
        lines += [
            "",
            "## Continuous batching: 1 slot vs many (issue 6)",
            "",
            BATCHING_NOTES,
            "",
            batching_tables(suite["batching"]),
        ]
        lines += ["", "![throughput](throughput_vs_concurrency.png) ![ttft](ttft_vs_concurrency.png)"]
    if suite.get("overhead"):
        lines += ["", "## Gateway overhead (issue 7)", "", OVERHEAD_NOTES, "", overhead_tables(suite["overhead"])]
    if suite.get("live_speed"):
        lines += ["", "## Predicted against measured on live traffic (issue 16)", "", LIVE_SPEED_NOTES, ""]
        lines += [live_speed_table(suite["live_speed"])]
    if suite.get("errors"):
        lines += ["", "## Stages that failed", ""] + [f"- {k}: {v}" for k, v in suite["errors"].items()]
    lines += ["", "Raw results: `batching.json`, `overhead.json`, `live_speed.json`, `suite.json` (provenance).", ""]
    return "\n".join(lines)
