"""What a deployment adds to a client's request on its way to the engine: `EngineTarget`.

Each gateway request type builds its engine request itself (`to_engine(target)`, as vLLM's request types
build their `SamplingParams`) and checks it against what the engine can honour (`check(capabilities,
label)`); this module holds what they share: the deployment's side of the translation (the name the worker
knows, the length defaults and cap, the model's sampling defaults) and the refusal of a kind the engine does
not serve. An image part leaves `IMAGE_MARKER` in the text and rides in `images`. It imports no wire
type, so `gateway.protocol` can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from backends.base import EngineCapabilities
from backends.request import ENGINE_PATHS, EngineImage, RequestKind
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.reasoning import ReasoningDefault


@dataclass(frozen=True)
class EngineTarget:
    """The deployment a request goes to, as its translation needs it.

    `model` is the name the worker knows; `default_max_tokens` applies when the request sets no limit (None
    for the translated APIs that OpenAI does not cap, such as Responses), `max_tokens_cap` is the server's
    cap (a request over it is a 400, or with `clamp` served with the cap); `sampling` holds the model's
    defaults for the fields a request leaves out; `embed_truncate` cuts over-long embedding inputs.
    `context_tokens` is the model's context per request (None when unknown: a remote endpoint's): a request
    for more output than it holds can never be served, and is a 400 naming its parameter, as OpenAI answers.
    """

    model: str
    default_max_tokens: int | None = None
    max_tokens_cap: int | None = None
    clamp: bool = False
    sampling: Mapping[str, float | int] = field(default_factory=dict)
    embed_truncate: bool = False
    images: tuple[EngineImage, ...] = ()  # the request's images, checked by `gateway.serving.vision_parts`
    reasoning: ReasoningDefault = field(default_factory=ReasoningDefault)  # config `reasoning`
    context_tokens: int | None = None

    def max_tokens(self, requested: int | None, param: str = "max_tokens") -> int | None:
        """max_tokens for the engine: the request's (`param` names the field it came in), else the model's
        default, else the server's cap; a request over the cap is a 400 naming `param`, or (`clamp`) is
        served with the cap; a request over the context is a 400 naming `param` whatever `clamp` says."""
        cap = self.max_tokens_cap
        if requested is not None and self.context_tokens is not None and requested > self.context_tokens:
            message = (f"{param} is too large: {requested}. This model's context holds {self.context_tokens} tokens, "
                       "prompt and output together")  # fmt: skip
            raise GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)
        if requested is not None and cap is not None and requested > cap:
            if self.clamp:
                return cap
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"{param} {requested} exceeds this server's cap of {cap}",
                               param=param)  # fmt: skip
        limit = requested
        if limit is None:
            limit = self.default_max_tokens if self.default_max_tokens is not None else cap
        if limit is not None and cap is not None:
            limit = min(limit, cap)
        return limit


def check_kind(kind: RequestKind, caps: EngineCapabilities, label: str) -> None:
    """Refuse a request of a kind the deployment (`label`: "model 'x' (engine)") does not serve."""
    if kind not in caps.kinds:
        raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, f"{label} does not serve {ENGINE_PATHS[kind]}",
                           param="model")  # fmt: skip


def refuse(message: str, param: str) -> GatewayError:
    """A parameter the deployment cannot honour: a 400 naming it."""
    return GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, message, param=param)
