"""Replicas (config `replicas: N`): the config makes `m@2`... as models of their own and refuses `@` names it did
not make; the registry groups them under their model; `Replicas.pick` hands the router each replica's load and
state (the real router; the e2e test `tests/e2e/test_replicas.py` runs two real workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp import LlamaCppAdapter
from gateway.admission import Admission
from gateway.config import Config
from gateway.config_replicas import replica_name, replica_of
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.workers import WorkerState
from gateway.ops.metrics import Metrics
from gateway.placement.replica_choice import Planner, resolve_with
from gateway.protocol.requests import ChatCompletionRequest
from gateway.serving.replicas import Replicas, routing_text
from tests.fakes.asgi_worker import FakeWorker


def config(*models: dict[str, Any]) -> Config:
    return Config.model_validate({"gpus": "none", "models": list(models)})


def spec(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "sources": [{"gguf": f"/m/{name}.gguf"}], **extra}


def test_replicas_are_models_of_their_own_named_after_theirs() -> None:
    c = config(spec("m", aliases=["a"], alias_patterns=["claude-*"], replicas=3, context=2048), spec("n", replicas=1))
    assert [(m.name, m.aliases, m.alias_patterns, m.replicas) for m in c.models] == [
        ("m", ("a",), ("claude-*",), 3), ("m@2", (), (), 1), ("m@3", (), (), 1), ("n", (), (), 1)]  # fmt: skip
    assert {m.context for m in c.models[:3]} == {2048}
    assert [replica_of(m.name) for m in c.models] == [None, "m", "m", None]
    assert replica_name("m", 1) == "m" and replica_name("m", 2) == "m@2"


def test_a_dumped_config_reads_back_the_same() -> None:
    c = config(spec("m", replicas=2, concurrency=7))
    assert Config.model_validate(c.model_dump(mode="json")).models == c.models


def test_concurrency_is_the_models_split_among_its_replicas() -> None:
    """As `replicas: auto` counts it: 64 sessions over 2 replicas are 32 each (not 64 each, which on a shared
    GPU left the second replica no memory); an odd count rounds up."""
    assert [m.concurrency for m in config(spec("m", replicas=2, concurrency=64)).models] == [32, 32]
    assert [m.concurrency for m in config(spec("m", replicas=3, concurrency=7)).models] == [3, 3, 3]


@pytest.mark.parametrize("name", ["m@3", "x@2"])
def test_an_at_name_the_config_did_not_make_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="names a replica"):
        config(spec("m", replicas=2), spec(name))


def test_a_remote_endpoint_has_no_replicas_here() -> None:
    remote = {"name": "r", "sources": [{"remote": "http://10.0.0.2:8000/v1"}]}
    with pytest.raises(ValidationError, match="remote endpoint is one server"):
        config({**remote, "replicas": 2})
    assert [m.name for m in config({**remote, "replicas": "auto"}).models] == ["r"]  # the default: one, here


def test_auto_is_the_default_and_one_gpu_or_one_session_resolves_to_one_without_planning() -> None:
    """The default `auto` costs a config with nothing to compare no plan and says nothing in its notes."""
    c = config(spec("m"), spec("n", concurrency=1))
    assert [m.replicas for m in c.models] == ["auto", "auto"]
    planned: list[Config] = []
    planner = Planner(plan=planned.append, decision=lambda *_: None, where=lambda *_: None,
                      gpus=lambda _spec: 1, devices=lambda *_: frozenset())  # fmt: skip
    resolved, notes, report = resolve_with(c, planner)
    assert [m.replicas for m in resolved.models] == [1, 1] and notes == {} and report is None and planned == []


def deployment(name: str, state: WorkerState = WorkerState.READY, load: str = "always") -> Deployment:
    fields = {"model": name, "engine": EngineName.LLAMACPP, "context_tokens": 512, "source_path": Path("/m/m.gguf")}
    plan = DeploymentPlan.model_validate({**fields, "model_format": "gguf", "slots": 2})
    worker = FakeWorker(name)
    worker.state = state
    return Deployment(name, (), plan, LlamaCppAdapter(), worker, Admission(name, 2, 8, 5), load=load)  # type: ignore[arg-type]


def registry(*deployments: Deployment) -> Registry:
    reg = Registry()
    for d in deployments:
        reg.add(d)
    return reg


def chat(text: str) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": text}]})


def test_the_registry_groups_replicas_under_their_model() -> None:
    m, m2, mm = deployment("m"), deployment("m@2"), deployment("mm")
    reg = registry(m, mm, m2)
    assert reg.replicas(m) == [m, m2] and reg.replicas(mm) == [mm]
    assert m2.replica_of == "m" and m.replica_of is None


def test_the_least_loaded_replica_then_the_sessions_own() -> None:
    m, m2 = deployment("m"), deployment("m@2")
    replicas = Replicas(registry(m, m2), Metrics())
    m.admission.running = 2
    assert replicas.pick(m, chat("hello"), "s1") is m2  # load
    m.admission.running, m2.admission.running = 0, 1
    assert replicas.pick(m, chat("hello again"), "s1") is m2  # session, though m is idle


def test_a_failed_or_stopping_replica_takes_nothing_and_an_unloaded_one_waits_its_turn() -> None:
    m, m2 = deployment("m", WorkerState.FAILED), deployment("m@2")
    replicas = Replicas(registry(m, m2), Metrics())
    assert replicas.pick(m, chat("a"), None) is m2
    m2.worker.state = WorkerState.STOPPING
    assert replicas.pick(m, chat("a"), None) is m  # none takes requests: the model's own (its residency says why)
    lazy, lazy2 = deployment("l"), deployment("l@2", WorkerState.STOPPED, load="on_demand")
    replicas = Replicas(registry(lazy, lazy2), Metrics())
    lazy.admission.running = 4
    assert replicas.pick(lazy, chat("b"), None) is lazy  # 4 outstanding: not yet worth loading another
    lazy.admission.running = 6
    assert replicas.pick(lazy, chat("b"), None) is lazy2


def test_a_full_replica_takes_nothing_while_another_has_room() -> None:
    m, m2 = deployment("m"), deployment("m@2")
    replicas = Replicas(registry(m, m2), Metrics())
    assert replicas.pick(m, chat("a"), "s") is m
    m.admission.running, m2.admission.running = 2, 2
    m.admission._waiters.extend([object()] * 8)  # type: ignore[list-item]  # its queue (max 8) is full
    assert replicas.pick(m, chat("a"), "s") is m2  # not the session's replica: it would answer 429


def test_a_starting_replica_waits_while_a_ready_one_is_not_busy() -> None:
    m, m2 = deployment("m", WorkerState.STARTING), deployment("m@2")  # m: restarting, or re-placed on a host
    replicas = Replicas(registry(m, m2), Metrics())
    m2.admission.running = 2
    assert replicas.pick(m, chat("a"), None) is m2
    m2.admission.running, m2.admission.max_queue = 2, 99
    m2.admission._waiters.extend([object()] * 4)  # type: ignore[list-item]
    assert replicas.pick(m, chat("a"), None) is m


def test_one_replica_costs_nothing() -> None:
    m = deployment("m")
    assert Replicas(registry(m), Metrics()).pick(m, chat("x"), None) is m


def test_routing_text_is_the_prompt_or_the_messages_text() -> None:
    assert routing_text("abc") == "abc"
    assert routing_text([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) == "s\nu"
    assert routing_text(None) == ""


async def test_a_reload_that_raises_replicas_adds_a_worker_and_leaves_the_first_serving() -> None:
    from gateway.reload import Desired, Reloader

    old = config(spec("m"))
    new = config(spec("m", replicas=2))
    serving, added = deployment("m"), deployment("m@2")
    reg = registry(serving)
    made: list[str] = []

    def make(plan: DeploymentPlan, _spec: Any) -> Deployment:
        made.append(plan.model)
        return added

    class Adopting:  # the residency's two calls a reload makes
        def adopt(self, deployment: Deployment, memory: Any) -> None:
            made.append(f"adopted {deployment.name}")

        async def retire(self, deployment: Deployment) -> None:
            made.append(f"retired {deployment.name}")

    plans = (serving.plan, added.plan)
    reloader = Reloader(lambda: Desired(new, plans, {}, {}), Desired(old, plans[:1], {}, {}), reg, Adopting(), make)  # type: ignore[arg-type]
    result = await reloader.reload()
    assert (result.added, result.changed, result.unchanged) == (["m@2"], [], ["m"])
    assert made == ["m@2", "adopted m@2"]  # the first replica's worker serves on
    assert reg.replicas(serving) == [serving, added]
