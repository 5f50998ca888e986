"""The registry: public model names and aliases → Deployment (plan + engine adapter + worker + admission)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from backends.base import DeploymentPlan, EngineAdapter, EngineCapabilities
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.policy import Policy, policy_for
from gateway.lifecycle.workers import Worker
from gateway.serving.admission import Admission
from gateway.serving.reasoning import ReasoningDefault


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
    reasoning: ReasoningDefault = field(default_factory=ReasoningDefault)  # config `reasoning`

    @property
    def policy(self) -> Policy:
        """How this model lives (pinned, on demand or a remote endpoint): `gateway.lifecycle.policy`."""
        return policy_for(self.load, self.idle_unload_s, remote=self.plan.remote_url is not None)

    @property
    def capabilities(self) -> EngineCapabilities:
        return self.adapter.capabilities(self.plan)


@dataclass
class Registry:
    deployments: dict[str, Deployment] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    _by_name: dict[str, Deployment] = field(default_factory=dict)

    def add(self, deployment: Deployment) -> None:
        self.deployments[deployment.name] = deployment
        for name in (deployment.name, *deployment.aliases):
            self._by_name[name] = deployment

    def remove(self, name: str) -> Deployment | None:
        """Take a deployment out (a config reload): its name and aliases stop resolving at once."""
        deployment = self.deployments.pop(name, None)
        if deployment is not None:
            for key in (deployment.name, *deployment.aliases):
                if self._by_name.get(key) is deployment:
                    del self._by_name[key]
        return deployment

    def resolve(self, model: str) -> Deployment:
        deployment = self._by_name.get(model)
        if deployment is not None:
            return deployment
        if model in self.refused:
            raise GatewayError(
                ErrorCode.WORKER_UNAVAILABLE,
                f"model {model!r} is configured but could not be placed: {self.refused[model]}",
                param="model",
            )
        known = ", ".join(sorted(self.deployments)) or "none"
        raise GatewayError(
            ErrorCode.MODEL_NOT_FOUND,
            f"The model {model!r} does not exist or you do not have access to it. Available: {known}",
            param="model",
        )

    def __iter__(self) -> Iterator[Deployment]:
        return iter(self.deployments.values())
