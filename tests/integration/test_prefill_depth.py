"""`bench.prefill_depth` on the embedded model: the real native layer fills a sequence to each depth, times the
new tokens there and reports each beside depth 0 (the numbers are the bench's; only their shape is checked)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.prefill_depth import main


def test_each_count_is_timed_at_each_depth_and_held_to_depth_zero(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--depths", "0", "96", "--counts", "8", "24", "--repeats", "2", "--ctx", "256"]
    assert main([*argv, "--threads", "1", "--n-batch", "16"]) == 0  # 24 new tokens: two chunks of the batch
    doc = json.loads((tmp_path / "prefill-depth.json").read_text())
    assert [(t["depth"], t["tokens"], len(t["ms"])) for t in doc["timings"]] == [(0, 8, 2), (0, 24, 2), (96, 8, 2),
                                                                                 (96, 24, 2)]  # fmt: skip
    assert all(ms > 0 for t in doc["timings"] for ms in t["ms"])
    assert [(r["tokens"], r["depth"], r["vs_depth0"] is not None) for r in doc["rows"]] == [
        (8, 0, True), (8, 96, True), (24, 0, True), (24, 96, True)]  # fmt: skip
    assert (tmp_path / "prefill-depth.md").read_text().startswith("# Prefill after a cached prefix")
