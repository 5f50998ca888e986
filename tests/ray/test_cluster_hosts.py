"""A head and two "hosts" on Ray (in a loopback-only namespace, tests/ray/conftest.py): the agents' simulated
inventories feed one plan across the hosts; host b's agent starts the real llama.cpp worker on the real
SmolLM2 GGUF, which serves the openai SDK over HTTP with its launch secret and refuses it without; a host
removed is seen as lost on its agent's next call."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

pytest.importorskip("ray", reason="needs the cluster extra: pip install -e '.[cluster]'")

# isort: split

from gateway.cluster import HostLost, plan_cluster
from gateway.cluster.access import new_worker_token
from gateway.cluster.host_worker import HostWorker
from gateway.cluster.live import hosts_from_agents
from gateway.cluster.ray_agent import cluster_hosts, spawn_agent
from gateway.config import Config
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.workers import WorkerState
from tests.ray.conftest import NODE_IP, LocalCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _config(smollm2_path: Path) -> Config:
    source = [{"gguf": str(smollm2_path)}]
    return Config.model_validate({"gpus": "none", "models": [
        {"name": "on-a", "sources": source, "context": 512, "hosts": ["a"]},
        {"name": "anywhere", "sources": source, "context": 512},
        {"name": "on-b", "sources": source, "context": 512, "concurrency": 2, "hosts": ["b"]},
        {"name": "absent", "sources": [{"gguf": "/nowhere/model.gguf"}], "context": 512},
    ]})  # fmt: skip


def test_one_plan_over_two_hosts_and_a_worker_served_on_host_b_with_its_secret(
    local_cluster: LocalCluster, smollm2_path: Path
) -> None:
    assert cluster_hosts() == {"a": NODE_IP, "b": NODE_IP}
    agents = [
        spawn_agent("a", local_cluster.nodes["a"].node_id, bind_host=NODE_IP, gpus="2xv100-32gb"),
        spawn_agent("b", local_cluster.nodes["b"].node_id, bind_host=NODE_IP, gpus="none"),
    ]
    config = _config(smollm2_path)
    hosts = asyncio.run(hosts_from_agents(agents, config))
    assert [len(h.inventory.gpus) for h in hosts] == [2, 0]  # each agent answers its own host's inventory
    assert all(h.missing == {"absent"} for h in hosts)
    report = plan_cluster(config, hosts)
    assert {d.model: d.host for d in report.decisions} == {"on-a": "a", "anywhere": "a", "on-b": "b", "absent": None}
    on_b = report.decision("on-b").decision
    assert on_b.plan is not None and on_b.plan.gpu_indices == () and on_b.prediction is not None
    assert "has no file of this model" in (report.decision("absent").decision.refusal or "")

    token = new_worker_token()
    started = asyncio.run(agents[1].start_worker(on_b.plan, token, wait_s=300))
    assert started.state is WorkerState.READY, started.last_error
    assert started.url is not None and started.url.startswith(f"http://{NODE_IP}:")
    served = openai.OpenAI(base_url=started.url + "/v1", api_key=token, max_retries=0, timeout=120)
    reply = served.chat.completions.create(model="on-b", messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=8, temperature=0)  # fmt: skip
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    for wrong in ("", "not-the-token"):
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=started.url + "/v1", api_key=wrong or "x", max_retries=0).models.list()

    described = asyncio.run(agents[1].describe())
    (worker,) = described.workers
    assert worker.name == "on-b" and worker.state is WorkerState.READY
    assert worker.rss_bytes is not None and worker.rss_bytes > 50 * 2**20  # the loaded model, really measured
    assert asyncio.run(agents[1].worker("on-b")).pid == worker.pid
    asyncio.run(agents[1].stop_worker("on-b"))
    assert asyncio.run(agents[1].describe()).workers == []


def test_a_removed_host_is_seen_as_lost(local_cluster: LocalCluster) -> None:
    agent_a = spawn_agent("a", local_cluster.nodes["a"].node_id, bind_host=NODE_IP, gpus="v100-16gb")
    agent_b = spawn_agent("b", local_cluster.nodes["b"].node_id, bind_host=NODE_IP, gpus="v100-32gb")
    assert asyncio.run(agent_a.describe()).host == "a"
    assert asyncio.run(agent_b.describe()).host == "b"
    local_cluster.cluster.remove_node(local_cluster.nodes["a"], allow_graceful=False)  # as a host dies: SIGKILL
    lost = None
    deadline = time.monotonic() + 120  # a guard against a hang, not a speed assertion
    while lost is None and time.monotonic() < deadline:
        try:
            asyncio.run(agent_a.describe())  # the actor's process may answer a moment after its raylet died
            time.sleep(0.5)
        except HostLost as exc:
            lost = exc
    assert lost is not None and lost.host == "a" and "host 'a' is lost" in str(lost)
    assert asyncio.run(agent_b.describe()).inventory.gpus[0].name.endswith("32GB")  # the other host serves on
    deadline = time.monotonic() + 60
    while "a" in cluster_hosts() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster_hosts() == {"b": NODE_IP}


def test_plan_cluster_ray_asks_every_live_host(local_cluster: LocalCluster, smollm2_path: Path, tmp_path: Path) -> None:
    """`voltgate plan --cluster ray:ADDRESS` as a user runs it: its own driver, agents found or started per host."""
    (tmp_path / "c.yaml").write_text(
        f"gpus: none\nmodels:\n  - {{name: m, sources: [{{gguf: {smollm2_path}}}], context: 512, hosts: [b]}}\n"
    )
    argv = ["-m", "gateway", "plan", "--json", "--config", str(tmp_path / "c.yaml")]
    done = subprocess.run([sys.executable, *argv, "--cluster", f"ray:{local_cluster.cluster.address}"],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert sorted(h["host"] for h in data["hosts"]) == ["a", "b"]
    assert {h["host"]: h["address"] for h in data["hosts"]} == {"a": NODE_IP, "b": NODE_IP}
    assert data["decisions"][0]["host"] == "b" and data["decisions"][0]["decision"]["plan"] is not None


def test_a_worker_on_a_lost_host_cuts_its_stream_and_answers_503_naming_the_host(
    local_cluster: LocalCluster, smollm2_path: Path
) -> None:
    """The gateway's handle (HostWorker) on host a's worker: served, then the host is SIGKILLed mid-stream."""
    config = Config.model_validate({"gpus": "none", "models": [
        {"name": "m", "sources": [{"gguf": str(smollm2_path)}], "context": 2048, "hosts": ["a"]}]})  # fmt: skip

    async def scenario() -> None:
        agents = [spawn_agent(h, local_cluster.nodes[h].node_id, bind_host=NODE_IP, gpus="none") for h in ("a", "b")]
        report = plan_cluster(config, await hosts_from_agents(agents, config))
        plan = report.decision("m").decision.plan
        assert report.host_of("m") == "a" and plan is not None
        worker = HostWorker(plan, agents[0], interval_s=0.5)
        await worker.ensure_ready(300)
        token = worker.headers["Authorization"].removeprefix("Bearer ")
        client = openai.AsyncOpenAI(base_url=worker.base_url() + "/v1", api_key=token, max_retries=0, timeout=60)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Count from 1 to 1000, one number per line."}],
            max_tokens=1500, temperature=0, stream=True,
            extra_body={"ignore_eos": True},  # never ends on its own before the kill lands (a fast CPU once did)
        )  # fmt: skip
        chunks, cut = 0, None
        try:
            async for _ in stream:
                chunks += 1
                if chunks == 3:  # the stream is flowing: the host dies now
                    await asyncio.to_thread(local_cluster.cluster.remove_node, local_cluster.nodes["a"], False)
        except (openai.APIError, httpx.HTTPError) as exc:
            cut = exc
        assert cut is not None, f"the stream ran to its end ({chunks} chunks) although its host was killed"
        deadline = time.monotonic() + 120  # a guard against a hang, not a speed assertion
        while worker.lost is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert worker.state is WorkerState.FAILED and worker.lost and "host 'a' is lost" in worker.lost
        with pytest.raises(GatewayError, match="model 'm' is unavailable: host 'a' is lost") as refused:
            worker.base_url()
        assert refused.value.code is ErrorCode.WORKER_UNAVAILABLE
        await worker.stop()
        assert (await agents[1].describe()).host == "b"  # the other host serves on

    asyncio.run(scenario())
