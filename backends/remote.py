"""An already-running OpenAI-compatible endpoint on another host: nothing to launch, only to speak to."""

from __future__ import annotations

from typing import Any, ClassVar

from backends.base import (
    DeploymentPlan,
    EngineCapabilities,
    EngineName,
    LaunchSpec,
    RequestKind,
    UpstreamError,
    normalize_openai_error,
)


class RemoteAdapter:
    engine: ClassVar[EngineName] = EngineName.REMOTE
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities(
        kinds=frozenset({RequestKind.CHAT, RequestKind.COMPLETION, RequestKind.EMBEDDING}), json_mode=True
    )

    def launch_spec(self, plan: DeploymentPlan, port: int) -> LaunchSpec:
        del port
        raise TypeError(f"model {plan.model!r} is served by {plan.remote_url}; there is no process to launch")

    def translate_request(self, kind: RequestKind, body: dict[str, Any]) -> dict[str, Any]:
        """The endpoint speaks OpenAI's dialect; the gateway already set the model name it knows."""
        del kind
        return body

    def normalize_error(self, status: int, body: bytes) -> UpstreamError:
        return normalize_openai_error(status, body)
