"""The host agent over Ray Core: one actor per host, pinned by the custom resource `voltgate_host:<name>`.

The only module of voltgate that imports Ray (the `cluster` extra). Each host joins with
`ray start --address HEAD:6379 --resources '{"voltgate_host:<name>": 1}'`; `spawn_agent` places a
`LocalHostAgent` there as an actor (0 CPUs, the whole `voltgate_host:<name>` unit, so one per host), and
`RayHostAgent` is the gateway's `HostAgent` handle to it. Calls carry JSON (the pydantic models of
`gateway.cluster.agent`), never Ray objects, so another transport can replace this one unchanged. Requests
never go through Ray: the gateway reaches each worker over HTTP at the URL its agent reports.

A host that dies or leaves fails every call on its actor with a Ray actor error, which `RayHostAgent` raises
as `HostLost` (seen within about 2 s on a local cluster); a call that gets no answer within `call_timeout_s`
raises `HostLost` too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import ray
import ray.exceptions

from backends.base import DeploymentPlan
from gateway.cluster.agent import HostLost, HostReport, UnknownWorker, WorkerReport
from gateway.cluster.host_agent import LocalHostAgent

NAMESPACE = "voltgate"
RESOURCE_PREFIX = "voltgate_host:"


CALL_TIMEOUT_S = 30.0
"""A call on an agent with no answer this long: the host is lost (`server.host_silence_s`, whose default it is)."""


def host_resource(host: str) -> str:
    """The custom resource a host declares (amount 1) so its agent lands on it."""
    return RESOURCE_PREFIX + host


class _AgentActor:
    """The actor body: a `LocalHostAgent` whose answers travel as JSON."""

    def __init__(self, host: str, bind_host: str, advertise: str | None, gpus: str) -> None:
        self._agent = LocalHostAgent(host, bind_host=bind_host, advertise=advertise, gpus=gpus)

    async def describe(self, paths: list[str]) -> str:
        return (await self._agent.describe(paths)).model_dump_json()

    async def start_worker(self, plan_json: str, token: str, wait_s: float) -> str:
        plan = DeploymentPlan.model_validate_json(plan_json)
        return (await self._agent.start_worker(plan, token, wait_s)).model_dump_json()

    async def worker(self, name: str) -> str | None:
        try:
            return (await self._agent.worker(name)).model_dump_json()
        except UnknownWorker:
            return None

    async def stop_worker(self, name: str, grace_s: float) -> None:
        await self._agent.stop_worker(name, grace_s)

    async def close(self) -> None:
        await self._agent.close()


class RayHostAgent:
    """The gateway's handle to one host's agent actor (a `gateway.cluster.agent.HostAgent`)."""

    def __init__(self, host: str, actor: Any, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.host = host
        self._actor = actor
        self._call_timeout_s = call_timeout_s

    async def describe(self, paths: Sequence[str] = ()) -> HostReport:
        return HostReport.model_validate_json(await self._call("describe", list(paths)))

    async def start_worker(self, plan: DeploymentPlan, token: str, wait_s: float = 600.0) -> WorkerReport:
        answer = await self._call("start_worker", plan.model_dump_json(), token, wait_s, timeout_s=wait_s + 30)
        return WorkerReport.model_validate_json(answer)

    async def worker(self, name: str) -> WorkerReport:
        answer = await self._call("worker", name)
        if answer is None:
            raise UnknownWorker(f"host {self.host!r} runs no worker {name!r}")
        return WorkerReport.model_validate_json(answer)

    async def stop_worker(self, name: str, grace_s: float = 10.0) -> None:
        await self._call("stop_worker", name, grace_s, timeout_s=grace_s + 30)

    async def close(self) -> None:
        """Stop every worker of this agent, then the actor itself."""
        try:
            await self._call("close", timeout_s=60)
        finally:
            ray.kill(self._actor)

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        ref = getattr(self._actor, method).remote(*args)
        try:
            return await asyncio.wait_for(ref, timeout_s or self._call_timeout_s)
        except ray.exceptions.RayActorError as exc:  # ActorDiedError, ActorUnavailableError: the host is gone
            raise HostLost(self.host, type(exc).__name__) from exc
        except TimeoutError:
            raise HostLost(
                self.host, f"no answer to {method} within {timeout_s or self._call_timeout_s:.0f} s"
            ) from None


def agent_name(host: str, node_id: str) -> str:
    """The agent's actor name: the host and its Ray node, so a host that left and joined again (a new node)
    gets a fresh agent and never the dead one of its old node (whose name Ray may not have released yet)."""
    return f"agent:{host}@{node_id[:16]}"


def spawn_agent(
    host: str, node_id: str, *, bind_host: str, advertise: str | None = None, gpus: str = "auto",
    detached: bool = False, call_timeout_s: float = CALL_TIMEOUT_S,
) -> RayHostAgent:  # fmt: skip
    """The agent of `host` on node `node_id` (started there unless it already runs, found by name in the
    `voltgate` namespace).

    `detached` agents outlive the gateway process that started them (and their workers with them), so a
    restarted gateway finds them again; docs/cluster.md says what that does and does not give yet."""
    options: dict[str, Any] = {
        "name": agent_name(host, node_id),
        "namespace": NAMESPACE,
        "get_if_exists": True,
        "num_cpus": 0,
        "resources": {host_resource(host): 1},
        "max_restarts": 0,
    }
    if detached:
        options["lifetime"] = "detached"
    actor = ray.remote(_AgentActor).options(**options).remote(host, bind_host, advertise, gpus)
    return RayHostAgent(host, actor, call_timeout_s)


def kill_agent(host: str, node_id: str) -> None:
    """End the agent of `host` on node `node_id` if it still exists: one asked for while its node was dying never
    started and would otherwise start on the host's next node, beside that node's own agent."""
    try:
        actor = ray.get_actor(agent_name(host, node_id), namespace=NAMESPACE)
    except ValueError:
        return  # no such actor: nothing to end
    ray.kill(actor, no_restart=True)


def cluster_hosts() -> dict[str, str]:
    """The hosts of the connected cluster that are alive and declare `voltgate_host:<name>`: name -> node IP."""
    return {name: ip for name, (ip, _) in cluster_nodes().items()}


def cluster_nodes() -> dict[str, tuple[str, str]]:
    """Like `cluster_hosts`, with each host's Ray node id: name -> (node IP, node id). A host that left and
    joined again has a new node id."""
    hosts = {}
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if not node.get("Alive"):
            continue
        for resource in node.get("Resources", {}):
            if resource.startswith(RESOURCE_PREFIX):
                hosts[resource.removeprefix(RESOURCE_PREFIX)] = (str(node["NodeManagerAddress"]), str(node["NodeID"]))
    return dict(sorted(hosts.items()))
