"""What handlers need from the running app, held on `app.state` by the lifespan (no module globals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from gateway.config import Config
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Registry
from gateway.ops.auth import KeyStore
from gateway.ops.metrics import Metrics
from gateway.ops.store import ResponseStore
from gateway.reload import Reloader
from gateway.serving.service import Service


@dataclass
class AppContext:
    config: Config
    registry: Registry
    service: Service
    metrics: Metrics
    keys: KeyStore
    placement: dict[str, Any] = field(default_factory=dict)
    accepting: bool = True
    store: ResponseStore | None = None  # stored Responses (`store: true`); the lifespan opens and closes it
    reloader: Reloader | None = None  # config reloads (`voltgate serve` sets it; an app built in a test may not)

    def check_accepting(self) -> None:
        if not self.accepting:
            raise GatewayError(ErrorCode.SHUTTING_DOWN, "the gateway is shutting down", retry_after_s=10)


def app_context(request: Request) -> AppContext:
    context: AppContext = request.app.state.voltgate
    return context
