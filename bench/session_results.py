"""A replayed session's turns and the tables `bench.session_replay` writes of them (issue 41's goals).

Each cached turn's TTFT is held to two one-turn prompts, both sent after the session, in the turn's own API:
- the turn's new *text* alone (the answer and the new message or tool result, as plain user text): the
  baseline since the bench began;
- a prompt of the turn's new *tokens*' count (`same_count`: the new text, a tag and filler words, until its
  prompt tokens come within 5 % of the turn's uncached tokens). A turn's uncached tokens also hold what the
  template writes around its new text (roles, the tool call's JSON and the result's tags) and the previous
  answer re-rendered, so the new text alone is often half as many tokens as the turn prefills; this one asks
  the issue's question (a one-turn prompt of the new tokens) with its own count. Only where the engine says
  how many tokens it took from cache (`cached_tokens`: the llama.cpp worker, not LMDeploy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.sessions import SessionKind

CACHE_GOAL = 0.90
TTFT_GOAL = 1.5


def _ratio(ttft: float | None, baseline: float | None) -> float | None:
    return None if ttft is None or not baseline else ttft / baseline


@dataclass
class TurnResult:
    index: int
    prompt_tokens: int | None
    cached_tokens: int | None
    ttft_s: float | None
    one_turn_ttft_s: float | None = None
    one_turn_prompt_tokens: int | None = None
    error: str | None = None
    same_count_ttft_s: float | None = None
    same_count_prompt_tokens: int | None = None

    @property
    def cached_share(self) -> float | None:
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens

    @property
    def new_tokens(self) -> int | None:
        """The prompt tokens this turn prefilled (those not from cache); None where the engine does not say."""
        if self.cached_tokens is None or self.prompt_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens

    @property
    def ttft_ratio(self) -> float | None:
        return _ratio(self.ttft_s, self.one_turn_ttft_s)

    @property
    def same_count_ratio(self) -> float | None:
        return _ratio(self.ttft_s, self.same_count_ttft_s)


@dataclass
class SessionResult:
    kind: SessionKind
    cache: str  # "on" | "off"
    rep: int
    total_s: float
    turns: list[TurnResult] = field(default_factory=list)
    cached_source: str = "usage"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for t, row in zip(self.turns, data["turns"], strict=True):
            row["cached_share"] = t.cached_share
            row["ttft_ratio"] = t.ttft_ratio
            row["same_count_ratio"] = t.same_count_ratio
        return data


DERIVED = ("cached_share", "ttft_ratio", "same_count_ratio")  # written by `to_json`, not fields


def _fmt(value: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def session_table(result: SessionResult) -> list[str]:
    """A markdown table of one session's turns."""
    lines = [
        f"**{result.kind}, caching {result.cache}, rep {result.rep + 1}**: total {result.total_s:.1f} s",
        "",
        "| turn | prompt tokens | cached | cached % | TTFT ms | one-turn TTFT ms (tokens) | TTFT / one-turn | "
        "same-count one-turn TTFT ms (tokens) | TTFT / same-count |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in result.turns:
        lines.append(
            f"| {t.index + 1} | {_fmt(t.prompt_tokens)} | {_fmt(t.cached_tokens)} | {_fmt(t.cached_share, 100, 1)} | "
            f"{_fmt(t.ttft_s, 1000)} | {_fmt(t.one_turn_ttft_s, 1000)} ({_fmt(t.one_turn_prompt_tokens)}) | "
            f"{_fmt(t.ttft_ratio, 1, 2)} | {_fmt(t.same_count_ttft_s, 1000)} ({_fmt(t.same_count_prompt_tokens)}) | "
            f"{_fmt(t.same_count_ratio, 1, 2)} |" + (f" error: {t.error}" if t.error else "")
        )
    return lines


def _within(ratios: Sequence[float | None]) -> str:
    """'k of n' turns within the TTFT goal; '-' where no turn had that baseline."""
    measured = [r for r in ratios if r is not None]
    return f"{sum(1 for r in measured if r <= TTFT_GOAL)} of {len(measured)}" if measured else "-"


def goal_summary(results: Sequence[SessionResult]) -> list[str]:
    """Per session kind and cache mode: turns from the second on meeting each goal, and total times."""
    lines = [
        "| session | caching | turns 2+ with >= 90 % cached | turns 2+ with TTFT <= 1.5x one-turn | "
        "turns 2+ with TTFT <= 1.5x same-count | median TTFT turns 2+ ms | session total s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in dict.fromkeys(r.kind for r in results):
        for cache in ("on", "off"):
            runs = [r for r in results if r.kind == kind and r.cache == cache]
            if not runs:
                continue
            later = [t for r in runs for t in r.turns if t.index >= 1]
            cached_ok = sum(1 for t in later if (t.cached_share or 0) >= CACHE_GOAL)
            ttft_ok = sum(1 for t in later if t.ttft_ratio is not None and t.ttft_ratio <= TTFT_GOAL)
            ttfts = sorted(t.ttft_s for t in later if t.ttft_s is not None)
            median = ttfts[len(ttfts) // 2] if ttfts else None
            totals = " / ".join(f"{r.total_s:.1f}" for r in runs)
            lines.append(
                f"| {kind} | {cache} | {cached_ok} of {len(later)} | {ttft_ok} of {len(later)} | "
                f"{_within([t.same_count_ratio for t in later])} | {_fmt(median, 1000)} | {totals} |"
            )
    return lines
