"""How long a local Ray cluster (a head and two "hosts") takes to start, and how long until the loss of a host
is seen by a call on its agent: a graceful leave and a SIGKILLed raylet. Run as root in a loopback-only
network namespace (docs/cluster.md, "Numbers"):

    unshare -n -p -f --mount-proc sh -c 'ip link set lo up && exec .venv/bin/python bench/cluster_host_loss.py'
"""

from __future__ import annotations

import asyncio
import json
import time

import ray
from ray.cluster_utils import Cluster

from gateway.cluster import HostLost
from gateway.cluster.ray_agent import NAMESPACE, host_resource, spawn_agent

NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 2**20, "include_dashboard": False}


def _until_lost(agent: object) -> float:
    began = time.monotonic()
    while time.monotonic() - began < 300:
        try:
            asyncio.run(agent.describe())  # type: ignore[attr-defined]
            time.sleep(0.1)
        except HostLost:
            return time.monotonic() - began
    return float("nan")


def main() -> None:
    began = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 1})
    nodes = {h: cluster.add_node(**NODE, num_cpus=1, resources={host_resource(h): 1}) for h in ("a", "b")}
    ray.init(address=cluster.address, namespace=NAMESPACE, _node_ip_address="127.0.0.1", log_to_driver=False)
    cluster.wait_for_nodes()
    started_s = time.monotonic() - began
    agents = {h: spawn_agent(h, bind_host="127.0.0.1", gpus="v100-16gb") for h in nodes}
    for agent in agents.values():
        asyncio.run(agent.describe())
    cluster.remove_node(nodes["a"], allow_graceful=True)
    graceful_s = _until_lost(agents["a"])
    cluster.remove_node(nodes["b"], allow_graceful=False)
    killed_s = _until_lost(agents["b"])
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps({"cluster_start_s": round(started_s, 1), "graceful_leave_seen_s": round(graceful_s, 1),
                      "killed_host_seen_s": round(killed_s, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
