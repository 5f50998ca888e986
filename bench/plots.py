"""PNG plots of concurrency sweeps: output throughput and TTFT vs concurrency, one line per series.

A series is `{"label": str, "levels": [{"concurrency": int, "summary": {...}}]}` — the shape `bench.loadgen`
writes, and the entries of the `series` list in batching/suite results. CLI:

    python -m bench.plots RESULT.json [RESULT.json ...] --out DIR
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt
from matplotlib.ticker import NullLocator

Series = dict[str, Any]
Metric = Callable[[dict[str, Any]], float | None]


def points(series: Series, metric: Metric) -> tuple[list[int], list[float]]:
    """(concurrency, value) pairs of a series, sorted by concurrency, skipping levels without a value."""
    pairs = []
    for level in series.get("levels", ()):
        c = level.get("concurrency")
        value = metric(level.get("summary") or {})
        if c is not None and value is not None:
            pairs.append((int(c), float(value)))
    pairs.sort()
    return [c for c, _ in pairs], [v for _, v in pairs]


def plot_metric(
    series: Sequence[Series], metric: Metric, *, ylabel: str, title: str, path: Path, note: str = ""
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ticks: set[int] = set()
    for s in series:
        xs, ys = points(s, metric)
        if xs:
            ax.plot(xs, ys, marker="o", label=s.get("label", "?"))
            ticks.update(xs)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    if ticks:
        ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, alpha=0.7)
    fig.tight_layout(rect=(0, 0.03 if note else 0, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_sweeps(series: Sequence[Series], out_dir: Path, *, prefix: str = "", note: str = "") -> list[Path]:
    """throughput_vs_concurrency.png and ttft_vs_concurrency.png (p50) for `series`."""
    return [
        plot_metric(
            series,
            lambda s: s.get("output_throughput"),
            ylabel="output tokens/s (all streams)",
            title="Aggregate output throughput vs concurrency",
            path=out_dir / f"{prefix}throughput_vs_concurrency.png",
            note=note,
        ),
        plot_metric(
            series,
            lambda s: (s.get("ttft_ms") or {}).get("p50"),
            ylabel="TTFT p50 (ms)",
            title="Time to first token vs concurrency",
            path=out_dir / f"{prefix}ttft_vs_concurrency.png",
            note=note,
        ),
    ]


def load_series(paths: Sequence[Path]) -> list[Series]:
    """Series from loadgen results (one each) or from results holding a `series` list."""
    out: list[Series] = []
    for path in paths:
        data = json.loads(path.read_text())
        if "series" in data:
            out.extend(data["series"])
        else:
            out.append({"label": data.get("label") or path.stem, "levels": data.get("levels", [])})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="directory for the PNGs")
    p.add_argument("--prefix", default="")
    p.add_argument("--note", default="", help="footnote on every plot (hardware, model)")
    args = p.parse_args(argv)
    for path in plot_sweeps(load_series(args.results), args.out, prefix=args.prefix, note=args.note):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
