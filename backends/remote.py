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
from backends.request import AnyEngineRequest, EngineRequest


class RemoteAdapter:
    engine: ClassVar[EngineName] = EngineName.REMOTE

    def capabilities(self, plan: DeploymentPlan) -> EngineCapabilities:
        """Whatever the endpoint serves: it answers for itself (its 400s are relayed as they are)."""
        del plan
        kinds = frozenset({RequestKind.CHAT, RequestKind.COMPLETION, RequestKind.EMBEDDING})
        return EngineCapabilities(kinds=kinds, json_schema=True, tools=True, logprobs=True)

    def launch_spec(self, plan: DeploymentPlan, port: int) -> LaunchSpec:
        del port
        raise TypeError(f"model {plan.model!r} is served by {plan.remote_url}; there is no process to launch")

    def translate_request(self, request: AnyEngineRequest) -> dict[str, Any]:
        """The endpoint speaks OpenAI's dialect; the gateway already set the model name it knows. voltgate's own
        `stream_options.include_prompt_usage` and `session_key` are left out (OpenAI refuses what it does not
        know)."""
        if isinstance(request, EngineRequest):
            request = request.without_prompt_usage().model_copy(update={"session_key": None})
        return request.wire()

    def normalize_error(self, status: int, body: bytes) -> UpstreamError:
        return normalize_openai_error(status, body)
