"""The registry: public model names, aliases and alias patterns → Deployment (plan + engine adapter + worker +
admission)."""

from __future__ import annotations

import fnmatch
import functools
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from backends.base import DeploymentPlan, EngineAdapter, EngineCapabilities
from gateway.admission import Admission
from gateway.config_replicas import replica_of
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.policy import Policy, policy_for
from gateway.lifecycle.workers import Worker
from gateway.protocol.reasoning import ReasoningDefault


@dataclass
class Deployment:
    name: str
    aliases: tuple[str, ...]
    plan: DeploymentPlan
    adapter: EngineAdapter
    worker: Worker
    admission: Admission
    created: int = field(default_factory=lambda: int(time.time()))
    default_max_tokens: int | None = None
    sampling: dict[str, float | int] = field(default_factory=dict)  # the model's defaults (config `sampling`)
    load: Literal["always", "on_demand"] = "always"
    idle_unload_s: float | None = None
    alias_patterns: tuple[str, ...] = ()  # config `alias_patterns`: globs of other names (`Registry.resolve`)
    reasoning: ReasoningDefault = field(default_factory=ReasoningDefault)  # config `reasoning`

    @property
    def replica_of(self) -> str | None:
        """The model this deployment is a replica of (`m` for `m@2`; None for a model or its first replica)."""
        return replica_of(self.name)

    @property
    def policy(self) -> Policy:
        """How this model lives (pinned, on demand or a remote endpoint): `gateway.lifecycle.policy`."""
        return policy_for(self.load, self.idle_unload_s, remote=self.plan.remote_url is not None)

    @functools.cached_property
    def capabilities(self) -> EngineCapabilities:
        """What its engine honours, read several times per request: built once (a reload makes a new
        `Deployment`; its plan and adapter never change)."""
        return self.adapter.capabilities(self.plan)


@dataclass
class Registry:
    deployments: dict[str, Deployment] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    _by_name: dict[str, Deployment] = field(default_factory=dict)
    _replicas: dict[str, list[Deployment]] = field(default_factory=dict)  # model → its replicas m@2... (not m)

    def add(self, deployment: Deployment) -> None:
        self.deployments[deployment.name] = deployment
        for name in (deployment.name, *deployment.aliases):
            self._by_name[name] = deployment
        if deployment.replica_of is not None:
            self._replicas.setdefault(deployment.replica_of, []).append(deployment)

    def remove(self, name: str) -> Deployment | None:
        """Take a deployment out (a config reload): its name and aliases stop resolving at once."""
        deployment = self.deployments.pop(name, None)
        if deployment is not None:
            for key in (deployment.name, *deployment.aliases):
                if self._by_name.get(key) is deployment:
                    del self._by_name[key]
            if deployment.replica_of is not None:
                self._replicas[deployment.replica_of].remove(deployment)
        return deployment

    def rename(self, name: str, aliases: tuple[str, ...], alias_patterns: tuple[str, ...]) -> None:
        """Give a serving deployment new aliases and alias patterns (a config reload): at once, worker untouched."""
        deployment = self.remove(name)
        if deployment is not None:
            deployment.aliases, deployment.alias_patterns = aliases, alias_patterns
            self.add(deployment)

    def resolve(self, model: str, task: Task | None = None) -> Deployment:
        """The deployment a public name reaches: its name or an alias exactly (a configured model that could not
        be placed: 503), else the model of `task` (None: any) with the most specific alias pattern that matches
        it (`match_pattern`); 404 `model_not_found` otherwise, naming a pattern that matched another kind."""
        deployment = self._by_name.get(model)
        if deployment is not None:
            return deployment
        if model in self.refused:
            raise GatewayError(
                ErrorCode.WORKER_UNAVAILABLE,
                f"model {model!r} is configured but could not be placed: {self.refused[model]}",
                param="model",
            )
        matched = match_pattern(model, self.deployments.values(), task)
        if isinstance(matched, Deployment):
            return matched
        if matched is not None:
            raise GatewayError(
                ErrorCode.MODEL_NOT_FOUND,
                f"The model {model!r} matches alias pattern {matched[1]!r} of {matched[0].name!r}, which serves "
                f"{matched[0].plan.task}, not {task}",
                param="model",
            )
        known = ", ".join(sorted(self.deployments)) or "none"
        raise GatewayError(
            ErrorCode.MODEL_NOT_FOUND,
            f"The model {model!r} does not exist or you do not have access to it. Available: {known}",
            param="model",
        )

    def has_replicas(self, deployment: Deployment) -> bool:
        """Whether `deployment`'s model has replicas beside it (a dict lookup: no list is built)."""
        return bool(self._replicas.get(deployment.name))

    def replicas(self, deployment: Deployment) -> list[Deployment]:
        """`deployment` and the replicas of its model (`m@2`...: config `replicas`), in order."""
        return [deployment, *self._replicas.get(deployment.name, ())]

    def __iter__(self) -> Iterator[Deployment]:
        return iter(self.deployments.values())


Task = Literal["generate", "embed", "rerank"]


def _specificity(pattern: str) -> tuple[int, int]:
    """How much of a name a pattern pins down: its literal characters, then its length."""
    return (len(pattern) - pattern.count("*") - pattern.count("?"), len(pattern))


def match_pattern(
    model: str, deployments: Iterable[Deployment], task: Task | None
) -> Deployment | tuple[Deployment, str] | None:
    """The deployment whose alias pattern matches `model` (case-sensitive globs) and that serves `task`: the
    most specific pattern wins (most literal characters, then the longest), a tie goes to the model whose name
    sorts first. None if no pattern matches; (deployment, pattern) if only models of another kind match."""
    best: tuple[tuple[int, int], str, Deployment] | None = None
    other: tuple[Deployment, str] | None = None
    for deployment in deployments:
        for pattern in deployment.alias_patterns:
            if not fnmatch.fnmatchcase(model, pattern):
                continue
            if task is not None and deployment.plan.task != task:
                other = other or (deployment, pattern)
                continue
            key = (_specificity(pattern), deployment.name, deployment)
            if best is None or key[0] > best[0] or (key[0] == best[0] and key[1] < best[1]):
                best = key
    return best[2] if best is not None else other
