"""The /v1/embeddings body a worker gets: the client's request checked once and validated by the worker's model.

The gateway refuses what it can tell without the model (no inputs, too many) and builds
`backends.request.EngineEmbeddingRequest`, the model the embedding worker validates with; what needs the
tokenizer (over-long inputs, token ids outside the vocabulary) is the worker's 400, relayed with its `param`.
"""

from __future__ import annotations

from pydantic import ValidationError

from backends.request import MAX_INPUTS, EngineEmbeddingRequest
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.requests import EmbeddingRequest, validation_error


def count_inputs(parsed: EmbeddingRequest) -> int:
    """How many vectors the request asks for: one text or one token array is one, a list is one each."""
    raw = parsed.input
    if isinstance(raw, str) or (raw and all(isinstance(item, int) for item in raw)):
        return 1
    return len(raw)


def build_embedding_request(parsed: EmbeddingRequest, *, model: str, truncate: bool) -> EngineEmbeddingRequest:
    """The worker's request for `parsed`, addressed to `model` (the name the worker knows); `truncate` cuts
    over-long inputs (the model's `embed_truncate`) instead of refusing them. `user` is not sent."""
    n = count_inputs(parsed)
    if n == 0:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "'input' must not be an empty list", param="input")
    if n > MAX_INPUTS:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"'input' has {n} items; at most {MAX_INPUTS}", param="input")
    try:
        return EngineEmbeddingRequest(
            model=model,
            input=parsed.input,
            encoding_format=parsed.encoding_format,
            dimensions=parsed.dimensions,
            truncate=truncate,
        )
    except ValidationError as exc:
        raise validation_error(exc) from None
