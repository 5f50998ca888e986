"""What the service needs of a client's request, whatever its API: `ServedRequest`.

Chat and text completions, embeddings and rerank (and the Responses and Messages APIs, which become chat
requests) implement it, so the service serves every kind without asking which one it has.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from backends.base import EngineCapabilities
from backends.request import AnyEngineRequest, RequestKind
from gateway.protocol.engine_requests import EngineTarget


class ServedRequest(Protocol):
    """A validated request on its way to an engine."""

    kind: ClassVar[RequestKind]

    @property
    def model(self) -> str:
        """The public model name (or alias) the client asked for."""
        ...

    @property
    def stream(self) -> bool: ...

    @property
    def include_usage(self) -> bool:
        """The client asked for the usage frame of a stream."""
        ...

    @property
    def units(self) -> int:
        """Admission slots the request takes: one per choice."""
        ...

    def check(self, caps: EngineCapabilities, label: str) -> None:
        """Raise a 400 `GatewayError` naming the parameter the deployment (`label`) cannot honour."""
        ...

    def to_engine(self, target: EngineTarget) -> AnyEngineRequest:
        """The engine's typed request for the deployment `target` describes (a 400 when it refuses it)."""
        ...

    def log_prompt(self) -> Any:
        """What the access log keeps of the request when `server.log_prompts` is on."""
        ...
