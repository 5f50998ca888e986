"""`llamacpp.grammar_step_limit_s` (issue 35): the config's bound on one token of a large grammar reaches the
worker's argv only when set (the worker's own default otherwise), and the config refuses a bound <= 0. The
bound itself is tested on the real worker (`tests/integration/test_slow_lane_worker.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp.adapter import LlamaCppAdapter

PLAN: dict[str, Any] = {"model": "h", "engine": EngineName.LLAMACPP, "source_path": Path("/m/h.gguf"),
                        "model_format": "gguf", "context_tokens": 512, "slots": 2}  # fmt: skip


def argv(**llamacpp: Any) -> list[str]:
    plan = DeploymentPlan.model_validate({**PLAN, "llamacpp": llamacpp} if llamacpp else PLAN)
    return LlamaCppAdapter(python="py").launch_spec(plan, 9).argv


def test_the_bound_reaches_the_worker_only_when_set() -> None:
    assert "--grammar-step-limit-s" not in argv()
    pinned = argv(grammar_step_limit_s=2.5)
    assert pinned[pinned.index("--grammar-step-limit-s") + 1] == "2.5"


def test_a_bound_of_zero_is_refused() -> None:
    with pytest.raises(ValidationError, match="grammar_step_limit_s"):
        argv(grammar_step_limit_s=0)


def test_the_prompt_caches_idle_time_reaches_the_worker_only_when_set() -> None:
    """`llamacpp.prompt_cache_idle_s` (issue 41): the same rule as the grammar bound; 0 (save at once) is allowed."""
    assert "--prompt-cache-idle-s" not in argv()
    for value, passed in ((0.5, "0.5"), (0, "0")):
        pinned = argv(prompt_cache_idle_s=value)
        assert pinned[pinned.index("--prompt-cache-idle-s") + 1] == passed
    with pytest.raises(ValidationError, match="prompt_cache_idle_s"):
        argv(prompt_cache_idle_s=-1)
