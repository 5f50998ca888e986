"""Replicas (config `replicas: N`): the config makes `m@2`... as models of their own and refuses `@` names it did
not make; the registry groups them under their model; `Replicas.pick` hands the router each replica's load and
state (the real router; the e2e test `tests/e2e/test_replicas.py` runs two real workers); a request whose
replica answered nothing is sent once more to another (`Service._retry`, over a `FakeNetwork` of fake engines)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp import LlamaCppAdapter
from gateway.admission import Admission
from gateway.config import Config, ServerSettings
from gateway.config_replicas import replica_name, replica_of
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.workers import WorkerState
from gateway.ops.auth import OPEN
from gateway.ops.metrics import Metrics
from gateway.placement.replica_choice import Planner, resolve_with
from gateway.protocol.requests import ChatCompletionRequest
from gateway.serving.replicas import Replicas, routing_text
from gateway.serving.service import RequestContext, Service, StreamSession, UnaryResult
from tests.fakes.asgi_worker import Behaviour, FakeEngine, FakeNetwork, FakeWorker
from tests.unit.test_service import USER, _drain, _request


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


def host(name: str) -> str:
    """A replica's fake worker's host on a `FakeNetwork` (`@` cannot be in a host)."""
    return name.replace("@", "-")


def deployment(name: str, state: WorkerState = WorkerState.READY, load: str = "always") -> Deployment:
    fields = {"model": name, "engine": EngineName.LLAMACPP, "context_tokens": 512, "source_path": Path("/m/m.gguf")}
    plan = DeploymentPlan.model_validate({**fields, "model_format": "gguf", "slots": 2})
    worker = FakeWorker(name, f"http://{host(name)}")
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


# -- a replica that answered nothing: the request goes to another ---------------------------------------------
class Retrying:
    """The service over replicas `names` of model `m`, each a fake engine behind one `FakeNetwork`."""

    def __init__(self, *names: str) -> None:
        self.deployments = {name: deployment(name) for name in names}
        self.engines = {host(name): FakeEngine(Behaviour(text=f"from {name}")) for name in names}
        self.network = FakeNetwork(self.engines)
        self.metrics = Metrics(gpu=False)
        client = httpx.AsyncClient(transport=self.network)
        settings = ServerSettings(keepalive_interval_s=0.05)
        self.service = Service(registry(*self.deployments.values()), client, settings, self.metrics)

    async def send(self, *, stream: bool = False, messages: list[dict[str, Any]] = USER) -> UnaryResult | StreamSession:
        parsed = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "stream": stream})
        ctx = RequestContext(request_id="req-1", principal=OPEN, started=0.0)
        return await self.service.handle(parsed, _request(), ctx)

    def requests(self) -> dict[tuple[str, str], float]:
        """voltgate:requests_total by (model, status), those counted."""
        found = self.metrics.registry.collect()
        return {(s.labels["model"], s.labels["status"]): s.value for f in found if f.name == "voltgate:requests"
                for s in f.samples if s.name.endswith("_total") and s.value}  # fmt: skip

    def retries(self) -> dict[tuple[str, str, str], float]:
        found = self.metrics.registry.collect()
        return {(s.labels["model"], s.labels["from_replica"], s.labels["reason"]): s.value for f in found
                if f.name == "voltgate:replica_retries" for s in f.samples if s.name.endswith("_total")}  # fmt: skip

    def neutralised(self) -> float:
        found = self.metrics.registry.collect()
        return sum(s.value for f in found if f.name == "voltgate:prompt_neutralised" for s in f.samples
                   if s.name.endswith("_total"))  # fmt: skip

    def idle(self) -> bool:
        return all(d.admission.running == 0 and d.admission.waiting == 0 for d in self.deployments.values())


def access_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.access"]
    return [(line["model"], line["status"]) for line in lines]


@pytest.mark.parametrize("fail", ["refuse", "reset"])
async def test_a_replica_that_refuses_the_connection_is_replaced_by_another(
    fail: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="voltgate.access")
    r = Retrying("m", "m@2")
    getattr(r.network, fail)("m")  # the router's first choice (both idle: the first)
    result = await r.send()
    assert isinstance(result, UnaryResult) and result.body is not None
    assert result.body["choices"][0]["message"]["content"] == "from m@2"
    assert r.network.calls == ["m", "m-2"]
    assert r.retries() == {("m", "m", "connect" if fail == "refuse" else "reset"): 1}
    assert r.requests() == {("m@2", "200"): 1} and access_lines(caplog) == [("m@2", 200)]  # accounted once
    assert r.idle()  # the failed attempt's slot released too


async def test_a_retried_request_counts_its_neutralised_prompt_bytes_once() -> None:
    r = Retrying("m", "m@2")
    r.network.refuse("m")
    billing = {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=cli;"}
    result = await r.send(messages=[billing, *USER])
    assert isinstance(result, UnaryResult) and result.status == 200
    assert r.retries() == {("m", "m", "connect"): 1} and r.neutralised() == 1


async def test_a_stream_whose_worker_was_declared_lost_is_answered_by_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="voltgate.access")
    r = Retrying("m", "m@2")
    lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    lost.set_result("host a went silent")
    r.deployments["m"].worker.lost = lost  # type: ignore[attr-defined]
    session = await r.send(stream=True)
    assert isinstance(session, StreamSession) and session.scope.model == "m@2"
    frames = b"".join(await _drain(session))
    assert b"from m@2" in frames and frames.endswith(b"data: [DONE]\n\n") and b'"error"' not in frames
    assert r.retries() == {("m", "m", "lost"): 1}
    assert r.requests() == {("m@2", "200"): 1} and access_lines(caplog) == [("m@2", 200)]
    assert r.idle()


async def test_a_session_moves_to_the_replica_that_answered_it() -> None:
    r = Retrying("m", "m@2")
    r.network.refuse("m")
    parsed = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, "user": "s1"})
    ctx = RequestContext(request_id="req-1", principal=OPEN, started=0.0, session_key="s1")
    await r.service.handle(parsed, _request(), ctx)
    del r.network.down["m"]
    ctx = RequestContext(request_id="req-2", principal=OPEN, started=0.0, session_key="s1")
    await r.service.handle(parsed, _request(), ctx)
    assert r.network.calls == ["m", "m-2", "m-2"]  # its next turn goes where its prefix now is


async def test_a_request_queued_at_a_replica_whose_worker_failed_meanwhile_is_answered_by_another() -> None:
    """What a real worker killed under load does to the requests queued behind its slots (the e2e test)."""
    r = Retrying("m", "m@2")
    m = r.deployments["m"]
    parsed = ChatCompletionRequest.model_validate({"model": "m", "messages": USER})
    ctx = RequestContext(request_id="req-1", principal=OPEN, started=0.0, session_key="s1")
    assert r.service.replicas.pick(m, parsed, "s1") is m  # the session is m's
    assert m.admission.try_acquire(2)  # both of m's slots busy: the session's next turn queues there
    queued = asyncio.ensure_future(r.service.handle(parsed, _request(), ctx))
    for _ in range(100):
        await asyncio.sleep(0)
    assert m.admission.waiting == 1
    m.worker.fail()  # type: ignore[attr-defined]
    m.admission.release(units=2)
    result = await queued
    assert isinstance(result, UnaryResult) and result.status == 200 and r.network.calls == ["m-2"]
    assert r.retries() == {("m", "m", "not_ready"): 1} and r.requests() == {("m@2", "200"): 1} and r.idle()


@pytest.mark.parametrize("names", [("m",), ("m", "m@2")], ids=["one-replica", "the-other-failed"])
async def test_one_replica_or_none_other_taking_requests_gets_the_503_as_before(
    names: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="voltgate.access")
    r = Retrying(*names)
    if "m@2" in r.deployments:
        r.deployments["m@2"].worker.state = WorkerState.FAILED
    r.network.refuse("m")
    with pytest.raises(GatewayError) as refused:
        await r.send()
    assert refused.value.code is ErrorCode.WORKER_UNAVAILABLE and refused.value.status == 503
    assert r.network.calls == ["m"] and r.retries() == {}
    assert r.requests() == {("m", "503"): 1} and access_lines(caplog) == [("m", 503)] and r.idle()


async def test_the_retry_is_once_only() -> None:
    r = Retrying("m", "m@2", "m@3")
    r.network.refuse("m")
    r.network.refuse("m-2")
    with pytest.raises(GatewayError) as refused:
        await r.send()
    assert refused.value.status == 503 and r.network.calls == ["m", "m-2"]
    assert r.requests() == {("m@2", "503"): 1} and r.idle()


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        (lambda r: setattr(r.engines["m"], "behaviour", Behaviour(status=503)), 503),  # the worker answered
        (lambda r: r.network.down.__setitem__("m", httpx.ReadTimeout), 504),  # accepted, then slow
    ],
    ids=["worker-answered-503", "read-timeout"],
)
async def test_an_answer_or_a_timeout_from_the_worker_is_not_sent_again(fault: Any, status: int) -> None:
    r = Retrying("m", "m@2")
    fault(r)
    with pytest.raises(GatewayError) as refused:
        await r.send()
    assert refused.value.status == status and r.network.calls == ["m"] and r.retries() == {}
    assert r.requests() == {("m", str(status)): 1} and r.idle()


async def test_a_stream_that_broke_after_its_first_bytes_ends_with_its_error_frame() -> None:
    r = Retrying("m", "m@2")
    r.network.break_after_first_frame("m")
    session = await r.send(stream=True)
    assert isinstance(session, StreamSession)
    frames = b"".join(await _drain(session))
    assert b'"error"' in frames and frames.endswith(b"data: [DONE]\n\n") and b"from m@2" not in frames
    assert r.network.calls == ["m"] and r.retries() == {}
    assert r.requests() == {("m", "503"): 1} and r.idle()
