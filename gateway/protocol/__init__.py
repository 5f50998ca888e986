"""OpenAI wire types: what the gateway accepts and what it emits. Never imports engine code."""

from gateway.protocol.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    InferenceRequest,
    parse_request,
)
from gateway.protocol.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionUsage,
    Model,
    ModelList,
)

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "Completion",
    "CompletionRequest",
    "CompletionUsage",
    "EmbeddingRequest",
    "InferenceRequest",
    "Model",
    "ModelList",
    "parse_request",
]
