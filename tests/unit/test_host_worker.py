"""HostWorker, the gateway's handle on a worker another host runs: it follows what the host's agent reports,
sends the launch secret it made, answers 503s that say why, and fails for good when the host is lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import httpx
import pytest

from backends.base import DeploymentPlan, EngineName
from backends.request import AnyEngineRequest, RequestKind
from gateway.cluster import HostLost, HostReport, WorkerReport
from gateway.cluster.host_worker import HostWorker
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment
from gateway.lifecycle.workers import WorkerStartError, WorkerState, restarted_message
from gateway.placement import Inventory
from gateway.serving.relay import DONE_FRAME, StreamStats, relay_stream, sse_frames
from gateway.serving.upstream import Upstream

PLAN = DeploymentPlan(model="m", engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"), model_format="gguf",
                      context_tokens=512)  # fmt: skip


class FakeHostAgent:
    """Stands for `gateway.cluster.agent.HostAgent` (the Ray actor of `gateway.cluster.ray_agent`): answers
    the reports it is told to, or raises `HostLost` once `lose()` was called."""

    def __init__(self, start_state: WorkerState = WorkerState.READY) -> None:
        self.host = "b"
        self.tokens: list[str] = []
        self.state = start_state
        self.stopped: list[str] = []
        self.url = "http://10.0.0.2:4000"
        self._lost = False

    def lose(self) -> None:
        self._lost = True

    def _report(self, name: str) -> WorkerReport:
        if self._lost:
            raise HostLost(self.host, "ActorDiedError")
        ready = self.state is WorkerState.READY
        return WorkerReport(name=name, state=self.state, url=self.url if ready else None,
                            last_error=None if ready else "exit 1")  # fmt: skip

    async def describe(self, paths: Sequence[str] = ()) -> HostReport:
        return HostReport(host=self.host, address="10.0.0.2", inventory=Inventory())

    async def start_worker(self, plan: DeploymentPlan, token: str, wait_s: float = 600.0) -> WorkerReport:
        self.tokens.append(token)
        return self._report(plan.model)

    async def worker(self, name: str) -> WorkerReport:
        return self._report(name)

    async def stop_worker(self, name: str, grace_s: float = 10.0) -> None:
        if self._lost:
            raise HostLost(self.host, "ActorDiedError")
        self.stopped.append(name)


async def test_ready_through_its_agent_with_the_secret_it_made() -> None:
    agent = FakeHostAgent()
    worker = HostWorker(PLAN, agent, interval_s=0.01)
    with pytest.raises(GatewayError, match="stopped on host 'b'"):
        worker.base_url()
    await worker.ensure_ready(5)
    assert worker.base_url() == "http://10.0.0.2:4000"
    assert worker.headers == {"Authorization": f"Bearer {agent.tokens[0]}"} and len(agent.tokens[0]) >= 40
    await worker.stop()
    assert agent.stopped == ["m"] and worker.state is WorkerState.STOPPED


async def test_it_follows_the_hosts_supervisor_through_a_crash() -> None:
    agent = FakeHostAgent()
    worker = HostWorker(PLAN, agent, interval_s=0.01)
    await worker.ensure_ready(5)
    agent.state = WorkerState.FAILED
    for _ in range(100):
        await asyncio.sleep(0.01)
    with pytest.raises(GatewayError, match=r"failed on host 'b'.*exit 1"):
        worker.base_url()
    agent.state = WorkerState.READY
    assert await worker.wait_ready(5)
    await worker.stop()


async def test_a_lost_host_fails_it_for_good_naming_the_host() -> None:
    agent = FakeHostAgent()
    worker = HostWorker(PLAN, agent, interval_s=0.01)
    await worker.ensure_ready(5)
    agent.lose()
    for _ in range(100):
        await asyncio.sleep(0.01)
    assert worker.state is WorkerState.FAILED
    with pytest.raises(GatewayError, match="model 'm' is unavailable: host 'b' is lost") as refused:
        worker.base_url()
    assert refused.value.code is ErrorCode.WORKER_UNAVAILABLE
    with pytest.raises(WorkerStartError, match="host 'b' is lost"):
        await worker.ensure_ready(1)
    await worker.stop()  # no call reaches the lost host's agent
    assert agent.stopped == []


async def test_a_start_that_fails_on_the_host_is_a_start_error() -> None:
    worker = HostWorker(PLAN, FakeHostAgent(start_state=WorkerState.FAILED), interval_s=0.01)
    with pytest.raises(WorkerStartError, match="exit 1"):
        await worker.ensure_ready(5)
    await worker.stop()


class _Adapter:
    def translate_request(self, request: object) -> dict[str, object]:
        return {"stream": True}


async def _server_that_freezes(first_frame: bool) -> tuple[asyncio.Server, str]:
    """A worker on a host that freezes: it reads the request, sends (with `first_frame`) the head and one SSE
    frame, then nothing, holding the connection open (a stopped host closes nothing)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if first_frame:
            frame = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 100000\r\n\r\n"
                         + frame)  # fmt: skip
            await writer.drain()
        await asyncio.sleep(3600)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _server_that_breaks_mid_stream() -> tuple[asyncio.Server, str]:
    """A worker that sends one SSE frame of a longer body, then drops the connection (as a dying host does)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        frame = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 100000\r\n\r\n" + frame)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _relay_through(worker: object) -> dict[str, str]:
    """Stream through the real Upstream and relay from `worker`; the error frame the client gets."""
    deployment = SimpleNamespace(name="m", worker=worker, adapter=_Adapter())
    async with httpx.AsyncClient(timeout=600) as client:
        upstream = Upstream(cast(Deployment, deployment), client, httpx.Timeout(10.0))
        response = await upstream.open_stream(cast(AnyEngineRequest, SimpleNamespace(kind=RequestKind.CHAT)))
        try:
            out = [f async for f in relay_stream(sse_frames(response), StreamStats(), model="m",
                                                  include_usage=False, keepalive_s=10.0)]  # fmt: skip
        finally:
            await response.aclose()
    assert out[-1] == DONE_FRAME
    error: dict[str, str] = json.loads(out[-2].removeprefix(b"data: "))["error"]
    return error


async def test_a_stream_cut_on_another_host_names_the_host_and_what_happens_next() -> None:
    server, url = await _server_that_breaks_mid_stream()
    agent = FakeHostAgent()
    agent.url = url
    worker = HostWorker(PLAN, agent, interval_s=60)
    try:
        await worker.ensure_ready(5)
        error = await _relay_through(worker)
    finally:
        await worker.stop()
        server.close()
    assert error["code"] == "worker_unavailable"
    message = error["message"]
    assert "host 'b'" in message and "RemoteProtocolError" in message, message
    assert "re-placed on another host" in message and "503" in message, message
    assert "being restarted" not in message, message


async def test_a_stream_cut_on_a_local_worker_keeps_saying_it_is_restarted() -> None:
    server, url = await _server_that_breaks_mid_stream()
    local = SimpleNamespace(base_url=lambda: url, headers={}, connection_lost=partial(restarted_message, "m"),
                            lost_signal=lambda: None)  # fmt: skip
    try:
        error = await _relay_through(local)
    finally:
        server.close()
    assert error["message"] == "model 'm': worker connection lost (RemoteProtocolError); it is being restarted"


async def test_a_lost_host_ends_the_calls_in_flight_there_at_once() -> None:
    """Issue 35 item 7: a frozen host closes no connection; once it is declared lost, a unary call waiting for
    its answer and a stream waiting for its next frame end at once (not after `upstream_timeout_s`, 600 s
    here), each with a 503 / error frame naming the host."""
    silent, silent_url = await _server_that_freezes(first_frame=False)
    midway, midway_url = await _server_that_freezes(first_frame=True)
    unary_agent, stream_agent = FakeHostAgent(), FakeHostAgent()
    unary_agent.url, stream_agent.url = silent_url, midway_url
    unary_worker = HostWorker(PLAN, unary_agent, interval_s=0.05)
    stream_worker = HostWorker(PLAN, stream_agent, interval_s=0.05)
    try:
        await unary_worker.ensure_ready(5)
        await stream_worker.ensure_ready(5)
        deployment = SimpleNamespace(name="m", worker=unary_worker, adapter=_Adapter())
        async with httpx.AsyncClient(timeout=600) as client:
            upstream = Upstream(cast(Deployment, deployment), client, httpx.Timeout(600.0))
            call = asyncio.create_task(upstream.post(cast(AnyEngineRequest, SimpleNamespace(kind=RequestKind.CHAT))))
            relayed = asyncio.create_task(_relay_through(stream_worker))
            await asyncio.sleep(0.3)
            assert not call.done() and not relayed.done()  # both wait on a host that says nothing
            unary_agent.lose()
            stream_agent.lose()
            with pytest.raises(GatewayError) as refused:
                await asyncio.wait_for(call, 30)  # a hang guard, not a speed limit
            error = await asyncio.wait_for(relayed, 30)
    finally:
        await unary_worker.stop()
        await stream_worker.stop()
        silent.close()
        midway.close()
    assert refused.value.code is ErrorCode.WORKER_UNAVAILABLE
    assert "host 'b'" in refused.value.message and "is lost" in refused.value.message, refused.value.message
    assert error["code"] == "worker_unavailable" and "host 'b'" in error["message"], error
