"""The GPU regression benchmark's table: phases measured in ABBA order → one row per (pair, streams) with
tok/s, TTFT p50 and the A/B ratios, beside each pair's previous committed run (the newest `regress.json` under
`bench/results/` with rows of that pair).

Pure functions over plain data, so `tests/unit/test_regress_table.py` checks them on hand-made inputs.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Side = Literal["A", "B"]
ABBA: tuple[Side, ...] = ("A", "B", "B", "A")


@dataclass(frozen=True)
class LevelMeasure:
    """One concurrency level of one phase: aggregate output tok/s and TTFT p50 (ms); None when nothing ended."""

    streams: int
    tok_s: float | None
    ttft_p50_ms: float | None
    completed: int
    requests: int


@dataclass(frozen=True)
class Phase:
    """One server started, measured at every level of its pair, stopped: the unit of the ABBA order."""

    pair: str
    side: Side
    label: str
    order: int  # position in the whole run
    levels: tuple[LevelMeasure, ...]


@dataclass
class Row:
    """One pair at one concurrency: A and B as the mean of their phases, the ratios, the previous run's."""

    pair: str
    streams: int
    a_label: str
    b_label: str
    a_tok_s: float | None
    b_tok_s: float | None
    a_ttft_p50_ms: float | None
    b_ttft_p50_ms: float | None
    a_runs: list[float | None] = field(default_factory=list)
    b_runs: list[float | None] = field(default_factory=list)
    b_status: str = "measured"  # or "not run: <why>"
    prev_tok_s_ratio: float | None = None
    prev_ttft_ratio: float | None = None
    prev_a_tok_s: float | None = None

    @property
    def tok_s_ratio(self) -> float | None:
        """A's tok/s over B's: > 1 means A is faster."""
        return _ratio(self.a_tok_s, self.b_tok_s)

    @property
    def ttft_ratio(self) -> float | None:
        """A's TTFT p50 over B's: < 1 means A starts sooner."""
        return _ratio(self.a_ttft_p50_ms, self.b_ttft_p50_ms)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"tok_s_ratio": self.tok_s_ratio, "ttft_ratio": self.ttft_ratio}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def abba_order(pairs: Sequence[str], *, b_runs: bool = True) -> list[tuple[str, Side]]:
    """The run order: for each pair A, B, B, A (only A, A when B cannot run)."""
    sides: tuple[Side, ...] = ABBA if b_runs else ("A", "A")
    return [(pair, side) for pair in pairs for side in sides]


def build_rows(phases: Sequence[Phase], b_status: dict[str, str] | None = None) -> list[Row]:
    """One row per (pair, streams), in the order the pairs and levels were first measured."""
    rows: dict[tuple[str, int], Row] = {}
    by_key: dict[tuple[str, int, Side], list[LevelMeasure]] = {}
    labels: dict[tuple[str, Side], str] = {}
    for phase in sorted(phases, key=lambda p: p.order):
        labels[(phase.pair, phase.side)] = phase.label
        for level in phase.levels:
            by_key.setdefault((phase.pair, level.streams, phase.side), []).append(level)
            rows.setdefault((phase.pair, level.streams), Row(phase.pair, level.streams, "", "", *([None] * 4)))
    for (pair, streams), row in rows.items():
        a = by_key.get((pair, streams, "A"), [])
        b = by_key.get((pair, streams, "B"), [])
        row.a_label, row.b_label = labels.get((pair, "A"), "-"), labels.get((pair, "B"), "-")
        row.a_runs, row.b_runs = [m.tok_s for m in a], [m.tok_s for m in b]
        row.a_tok_s, row.b_tok_s = _mean(row.a_runs), _mean(row.b_runs)
        row.a_ttft_p50_ms = _mean([m.ttft_p50_ms for m in a])
        row.b_ttft_p50_ms = _mean([m.ttft_p50_ms for m in b])
        row.b_status = (b_status or {}).get(pair, "measured" if b else "not run")
    return list(rows.values())


def find_previous(
    results_root: Path, *, exclude: Path | None = None, mode: str | None = None, pair: str | None = None
) -> Path | None:
    """The newest committed `regress.json` anywhere under `results_root/*/`, by the date its top folder's name
    starts with, then by the run's own start time (same-day folders' names say nothing of their order);
    leaving out `exclude`, runs of another `mode` and, with `pair`, runs without rows of that pair (a run of
    other pairs says nothing of this one)."""
    found: list[tuple[str, str, str, Path]] = []
    for path in results_root.glob("*/**/regress.json"):
        if exclude is not None and path.parent.resolve() == exclude.resolve():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if mode is not None and data.get("mode") != mode:
            continue
        if pair is not None and not any(r.get("pair") == pair for r in data.get("rows", [])):
            continue
        day = path.relative_to(results_root).parts[0][:10]
        found.append((day, str(data.get("meta", {}).get("started_utc", "")), str(path), path))
    return max(found)[3] if found else None


def attach_previous(rows: Sequence[Row], previous: dict[str, Any] | None) -> None:
    """Copy the previous run's ratios and A tok/s onto the rows with the same (pair, streams)."""
    if not previous:
        return
    old = {(r["pair"], r["streams"]): r for r in previous.get("rows", [])}
    for row in rows:
        match = old.get((row.pair, row.streams))
        if match:
            row.prev_tok_s_ratio = match.get("tok_s_ratio")
            row.prev_ttft_ratio = match.get("ttft_ratio")
            row.prev_a_tok_s = match.get("a_tok_s")


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


Previous = tuple[str, str, str | None]
"""A previous run beside this one: (the pairs it stands beside, its regress.json, its commit)."""


def render_markdown(rows: Sequence[Row], *, previous: Sequence[Previous] = ()) -> str:
    """The one table: A and B tok/s (mean of the ABBA phases), TTFT p50, the ratios, the previous run's."""
    prev = "; ".join(f"`{path}` ({commit or 'commit unknown'}) for {pairs}" for pairs, path, commit in previous)
    prev = f"previous runs: {prev}" if previous else "previous run: none committed"
    lines = [
        prev,
        "",
        "| pair | streams | A | A tok/s | B | B tok/s | A/B tok/s | A TTFT p50 ms | B TTFT p50 ms | A/B TTFT "
        "| previous A/B tok/s | previous A/B TTFT | previous A tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b_tok = _f(r.b_tok_s) if r.b_status == "measured" else r.b_status
        lines.append(
            f"| {r.pair} | {r.streams} | {r.a_label} | {_f(r.a_tok_s)} | {r.b_label} | {b_tok} | "
            f"{_f(r.tok_s_ratio, 3)} | {_f(r.a_ttft_p50_ms)} | {_f(r.b_ttft_p50_ms)} | {_f(r.ttft_ratio, 3)} | "
            f"{_f(r.prev_tok_s_ratio, 3)} | {_f(r.prev_ttft_ratio, 3)} | {_f(r.prev_a_tok_s)} |"
        )
    lines += ["", "A/B tok/s > 1: A is faster; A/B TTFT < 1: A starts sooner. tok/s and TTFT: the mean of the "
              "pair's phases (ABBA: A, B, B, A)."]  # fmt: skip
    return "\n".join(lines) + "\n"


_PHASE = re.compile(r"^== (?P<pair>\S+) (?P<side>[AB]) \((?P<label>[^)]*)\)$")
_LEVEL = re.compile(r"^(?P<pair>\S+)\s+c=(?P<c>\d+) ok=(?P<ok>\d+)/(?P<n>\d+) out=(?P<tok>[\d.,]+|-) tok/s .*"
                    r"ttft p50=(?P<ttft>[\d.,]+|-)")  # fmt: skip


def phases_from_log(text: str) -> list[Phase]:
    """The phases a run printed to its log (`== PAIR SIDE (LABEL)`, then one `bench.loadgen.format_row` line
    per level): the table of a run that ended before writing its `regress.json` (a machine taken back, the
    device time spent). A phase whose levels did not all print is kept with those that did."""
    phases: list[Phase] = []
    for line in text.splitlines():
        if (head := _PHASE.match(line.strip())) is not None:
            side: Side = "A" if head["side"] == "A" else "B"
            phases.append(Phase(head["pair"], side, head["label"], len(phases), ()))
        elif (level := _LEVEL.match(line.strip())) is not None and phases and level["pair"] == phases[-1].pair:
            measure = LevelMeasure(int(level["c"]), _number(level["tok"]), _number(level["ttft"]), int(level["ok"]),
                                   int(level["n"]))  # fmt: skip
            last = phases[-1]
            phases[-1] = Phase(last.pair, last.side, last.label, last.order, (*last.levels, measure))
    return [p for p in phases if p.levels]


def _number(value: str) -> float | None:
    """A printed figure (`1,234.5`), or None for `-` (nothing measured)."""
    return None if value == "-" else float(value.replace(",", ""))
