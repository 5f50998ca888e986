"""The llama.cpp worker's command line for a minimal GGUF plan with `llamacpp:` options: the shared harness of
the tests that check a config option reaches the worker only when set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp.adapter import LlamaCppAdapter

PLAN: dict[str, Any] = {"model": "h", "engine": EngineName.LLAMACPP, "source_path": Path("/m/h.gguf"),
                        "model_format": "gguf", "context_tokens": 512, "slots": 2}  # fmt: skip


def llamacpp_argv(**llamacpp: Any) -> list[str]:
    """The worker's argv for `PLAN` with these `llamacpp` options (validated as the config's)."""
    plan = DeploymentPlan.model_validate({**PLAN, "llamacpp": llamacpp} if llamacpp else PLAN)
    return LlamaCppAdapter(python="py").launch_spec(plan, 9).argv


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]
