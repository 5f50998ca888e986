"""Which replica of a model serves a request (config `replicas: N`, docs/replicas.md).

Service.handle ─▶ resolve(name) ─▶ Replicas.pick(deployment, parsed, session key) ─▶ one of m, m@2, ... m@N
                                        │ loads: each replica's admitted + queued requests, and whether it
                                        │        takes requests (its worker's state)
                                        └─▶ ReplicaRouter.pick: session, long prefix, else least loaded

A model with one replica is returned as it is, at no cost. The pick is counted per reason
(`voltgate:replica_picks_total`); a replica whose worker failed is forgotten by the router (its sessions and
prefixes go elsewhere) and takes no request until it is ready again. A request whose replica answered nothing
(its worker gone before its answer began) is sent once more, to the router's choice among the others (`retry`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.workers import WorkerState
from gateway.ops.metrics import Metrics
from gateway.protocol.served import ServedRequest
from gateway.serving.replica_router import NoReplica, ReplicaLoad, ReplicaRouter

SERVING = frozenset({WorkerState.READY, WorkerState.STARTING})
"""A replica in these states takes requests (a starting one queues them until it is ready)."""


class Replicas:
    """One `ReplicaRouter` per model with replicas; see the module docstring."""

    def __init__(self, registry: Registry, metrics: Metrics) -> None:
        self.registry, self.metrics = registry, metrics
        self._routers: dict[str, ReplicaRouter] = {}
        self._forgotten: set[str] = set()  # failed replicas already forgotten by their router

    def pick(self, deployment: Deployment, parsed: ServedRequest, session_key: str | None) -> Deployment:
        """The replica of `deployment`'s model for this request (`deployment` itself when it has none, or when
        none takes requests: the residency check then says why)."""
        group = self.registry.replicas(deployment)
        if len(group) == 1:
            return deployment
        routed = self._route(group, self._routers.setdefault(deployment.name, ReplicaRouter()), parsed, session_key)
        if routed is None:
            return deployment
        replica, reason = routed
        self.metrics.replica_picks.labels(deployment.name, replica.name, reason).inc()
        return replica

    def retry(
        self, deployment: Deployment, failed: Deployment, parsed: ServedRequest, session_key: str | None
    ) -> Deployment | None:
        """Another replica of `deployment`'s model for a request that `failed` answered nothing, chosen by the
        router among those that take requests, `failed` excluded (the session moves with it); None when there is
        none. Not counted in the picks: the service counts it in `replica_retries_total`."""
        group = self.registry.replicas(deployment)
        router = self._routers.get(deployment.name)
        if len(group) == 1 or router is None:
            return None
        routed = self._route(group, router, parsed, session_key, failed=failed)
        return None if routed is None else routed[0]

    def _route(
        self,
        group: list[Deployment],
        router: ReplicaRouter,
        parsed: ServedRequest,
        session_key: str | None,
        failed: Deployment | None = None,
    ) -> tuple[Deployment, str] | None:
        """The router's choice among `group` and why, `failed` counted as taking nothing (each replica's load is
        read all the same: a failed one is forgotten there); None when none takes requests."""
        loads = [self._load(replica, router) for replica in group]
        loads = [replace(load, healthy=False) if r is failed else load for r, load in zip(group, loads, strict=True)]
        try:
            pick = router.pick(loads, routing_text(parsed.log_prompt()), session_key)
        except NoReplica:
            return None
        return next(replica for replica in group if replica.name == pick.replica), pick.reason

    def _load(self, replica: Deployment, router: ReplicaRouter) -> ReplicaLoad:
        """A replica as the router sees it: a starting or unloaded on-demand replica takes requests but counts as
        more loaded than `balance_abs` (the ready ones are preferred until they are that busy); a failed one is
        forgotten; one whose admission queue is full takes nothing (a 429 only when every replica's is)."""
        state, admission = replica.worker.state, replica.admission
        outstanding = admission.running + admission.waiting
        unloaded = state is WorkerState.STOPPED and not replica.policy.pinned  # an on-demand one, loaded by use
        if state is WorkerState.STARTING or unloaded:
            outstanding += router.balance_abs + 1  # the ready ones first
        elif state is WorkerState.FAILED and replica.name not in self._forgotten:
            router.forget(replica.name)  # once: forgetting walks the router's sessions
            self._forgotten.add(replica.name)
        if state is not WorkerState.FAILED:
            self._forgotten.discard(replica.name)
        return ReplicaLoad(replica.name, outstanding, healthy=(state in SERVING or unloaded) and not admission.full)


def routing_text(prompt: Any) -> str:
    """The text the router matches prefixes on: a completion's prompt, or a chat's messages' text in order."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content") or "") if isinstance(m, dict) else str(m) for m in prompt)
    return ""
