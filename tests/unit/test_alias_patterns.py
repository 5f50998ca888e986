"""Alias patterns (`alias_patterns: [claude-*]`): which model a name no model has exactly reaches, by kind and
specificity; how the config refuses a pattern that is no pattern; and a reload that changes only names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp import LlamaCppAdapter
from gateway.admission import Admission
from gateway.config import Config, ModelSpec
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.reload import Desired, Reloader
from tests.fakes.asgi_worker import FakeWorker


def deployment(name: str, *patterns: str, task: str = "generate", aliases: tuple[str, ...] = ()) -> Deployment:
    plan = DeploymentPlan.model_validate({"model": name, "engine": EngineName.LLAMACPP, "context_tokens": 512,
                                          "source_path": Path(f"/m/{name}.gguf"), "model_format": "gguf",
                                          "slots": 1, "task": task})  # fmt: skip
    return Deployment(name, aliases, plan, LlamaCppAdapter(), FakeWorker(name), Admission(name, 1, 1, 5),
                      alias_patterns=patterns)  # fmt: skip


def registry(*deployments: Deployment) -> Registry:
    reg = Registry()
    for d in deployments:
        reg.add(d)
    return reg


def test_exact_names_win_then_the_most_specific_pattern_of_the_requests_kind() -> None:
    reg = registry(
        deployment("coder", "claude-*", "gpt-*", "*", aliases=("claude-exact",)),
        deployment("fast", "claude-haiku-*"),
        deployment("embedder", "text-embedding-*", "*", task="embed"),
        deployment("claude-opus-5-5"),  # a model's own name is exact
    )
    assert reg.resolve("claude-opus-5-5", "generate").name == "claude-opus-5-5"
    assert reg.resolve("claude-exact", "generate").name == "coder"
    assert reg.resolve("claude-opus-5-6", "generate").name == "coder"
    assert reg.resolve("claude-haiku-4-5-20251001", "generate").name == "fast"  # more literal characters
    assert reg.resolve("gpt-5.5", "generate").name == "coder"
    assert reg.resolve("text-embedding-3-small", "embed").name == "embedder"
    assert reg.resolve("anything", "embed").name == "embedder" and reg.resolve("anything", "generate").name == "coder"
    assert reg.resolve("text-embedding-3-small").name == "embedder"  # any kind (GET /v1/models/{id})


def test_a_configured_model_that_could_not_be_placed_is_its_503_not_another_models_pattern() -> None:
    reg = registry(deployment("coder", "*"))
    reg.refused["big-model"] = "needs 80 GB"
    with pytest.raises(GatewayError) as caught:
        reg.resolve("big-model", "generate")
    assert caught.value.code is ErrorCode.WORKER_UNAVAILABLE
    assert reg.resolve("other", "generate").name == "coder"


def test_a_pattern_of_another_kind_only_is_a_404_that_names_it() -> None:
    reg = registry(deployment("coder", "claude-*"), deployment("embedder", "text-embedding-*", task="embed"))
    with pytest.raises(GatewayError) as caught:
        reg.resolve("text-embedding-3-small", "generate")
    assert caught.value.code is ErrorCode.MODEL_NOT_FOUND and caught.value.param == "model"
    assert "'text-embedding-*' of 'embedder', which serves embed, not generate" in caught.value.message
    with pytest.raises(GatewayError) as unknown:
        reg.resolve("llama-3", "generate")
    assert "does not exist" in unknown.value.message


def test_equally_specific_patterns_go_to_the_model_whose_name_sorts_first_and_removal_stops_matching() -> None:
    reg = registry(deployment("zeta", "gpt-*"), deployment("alpha", "gpt-*"))
    assert reg.resolve("gpt-4o", "generate").name == "alpha"
    reg.remove("alpha")
    assert reg.resolve("gpt-4o", "generate").name == "zeta"
    reg.rename("zeta", (), ())
    with pytest.raises(GatewayError):
        reg.resolve("gpt-4o", "generate")


def model(**fields: Any) -> dict[str, Any]:
    return {"name": "m", "sources": [{"gguf": "/m.gguf"}], **fields}


@pytest.mark.parametrize("pattern", ["claude-opus", "", "claude *", "claude-[a]*"])
def test_a_pattern_without_a_wildcard_or_with_other_characters_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="alias_patterns"):
        ModelSpec.model_validate(model(alias_patterns=[pattern]))


def test_patterns_are_kept_in_the_order_written() -> None:
    spec = ModelSpec.model_validate(model(alias_patterns=["claude-*", "gpt-?", "*"]))
    assert spec.alias_patterns == ("claude-*", "gpt-?", "*")


async def test_a_reload_that_changes_only_names_keeps_the_worker_and_answers_to_the_new_names_at_once() -> None:
    old = Config.model_validate({"models": [model(alias_patterns=["claude-*"])], "gpus": "none"})
    new = Config.model_validate({"models": [model(aliases=["smol"], alias_patterns=["gpt-*"])], "gpus": "none"})
    serving = deployment("m", "claude-*")
    reg = registry(serving)
    plans = (serving.plan,)
    made: list[str] = []

    def make(*_: Any) -> Deployment:
        made.append("made")
        return deployment("m")

    reloader = Reloader(lambda: Desired(new, plans, {}, {}), Desired(old, plans, {}, {}), reg, None, make)  # type: ignore[arg-type]
    result = await reloader.reload()
    assert (result.unchanged, result.renamed, result.changed, made) == (["m"], ["m"], [], [])
    assert reg.resolve("gpt-5", "generate") is serving and reg.resolve("smol") is serving
    with pytest.raises(GatewayError):
        reg.resolve("claude-opus-5-5", "generate")
