"""The hosts of a cluster for the plan: from a cluster file, or asked of each live host's agent.

`--cluster FILE` reads a simulated cluster (`gateway.cluster.hosts`); `--cluster ray` (or `ray:ADDRESS`)
connects to a running Ray cluster, starts or finds the agent of every host that declares
`voltgate_host:<name>`, and asks each for its inventory and which model files it has. Ray is imported only
on that second path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from gateway.cluster.agent import HostAgent
from gateway.cluster.hosts import HostView, load_cluster_file
from gateway.config import Config, ConfigError, ModelSpec, RemoteSource


class ClusterUnavailable(Exception):
    """The live cluster cannot be asked: Ray is not installed, or no cluster answers at that address."""


def model_paths(spec: ModelSpec, config: Config) -> list[str]:
    """The files a host must hold to run `spec` (any one of its sources), as the gateway resolves them."""
    paths = []
    for source in spec.sources:
        if isinstance(source, RemoteSource):
            continue
        try:
            paths.append(str(source.resolve(config.base_dir)))
        except ConfigError:
            continue  # a source that cannot be resolved is held by no host
    return paths


async def hosts_from_agents(agents: Sequence[HostAgent], config: Config) -> list[HostView]:
    """Each agent's host: its inventory, its address, and the models none of whose files it holds."""
    wanted = {spec.name: model_paths(spec, config) for spec in config.models if spec.remote is None}
    every = sorted({p for paths in wanted.values() for p in paths})
    reports = await asyncio.gather(*(agent.describe(every) for agent in agents))
    return [
        HostView(
            name=report.host,
            inventory=report.inventory,
            address=report.address,
            missing=frozenset(m for m, paths in wanted.items() if not any(report.files.get(p) for p in paths)),
            memory_available_bytes=report.memory_available_bytes,
        )
        for report in reports
    ]


def is_live(target: str) -> bool:
    """`--cluster ray` / `ray:HOST:PORT` name a live Ray cluster; anything else is a cluster file."""
    return target == "ray" or target.startswith("ray:")


def connect(target: str) -> None:
    """Connect this process to the live Ray cluster `target` names (`ray`: RAY_ADDRESS, else the local head;
    `ray:HOST:PORT`) as a driver in voltgate's namespace. Raises `ClusterUnavailable` with the reason."""
    try:
        import ray

        from gateway.cluster import ray_agent
    except ImportError as exc:
        raise ClusterUnavailable(f"--cluster {target} needs Ray: pip install 'voltgate[cluster]' ({exc})") from None
    address = target.removeprefix("ray").removeprefix(":") or "auto"
    try:
        ray.init(address=address, namespace=ray_agent.NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError) as exc:
        raise ClusterUnavailable(f"no Ray cluster at {address}: {exc}") from None


def cluster_hosts_for(target: str, config: Config) -> list[HostView]:
    """`target` is a cluster file, `ray` (RAY_ADDRESS, else the local head) or `ray:HOST:PORT`."""
    if not is_live(target):
        return load_cluster_file(Path(target))
    connect(target)
    import ray

    from gateway.cluster import ray_agent

    try:
        nodes = ray_agent.cluster_nodes()
        if not nodes:
            raise ClusterUnavailable("the Ray cluster has no host declaring a voltgate_host:<name> resource")
        agents = [ray_agent.spawn_agent(name, node, bind_host=ip) for name, (ip, node) in nodes.items()]
        return asyncio.run(hosts_from_agents(agents, config))
    finally:
        ray.shutdown()
