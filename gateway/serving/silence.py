"""How long a worker may send nothing before the gateway ends its request (issue 35 item 7).

A worker whose HTTP server answers while its engine is stuck (a wedged GPU kernel, a scheduler that lost a
sequence, a process stopped with nothing watching its health) passes or escapes its health check, so the
frozen-worker watchdog never fires; its requests would hang until `server.upstream_timeout_s` (600 s). Each
call's read timeout is instead the longest a healthy worker can be silent on it, from the plan's prediction,
times SILENCE_MARGIN, never under `server.stream_silence_floor_s` nor over `upstream_timeout_s`:

    silence_s = min(upstream_timeout_s, max(stream_silence_floor_s, SILENCE_MARGIN x healthy_s))

`healthy_s` by the call:

- A stream from an engine that speaks every step (our llama.cpp worker: `: prefilling` comments every 0.5 s
  before the first token, then a chunk per step of at most `longest_step_tokens`): one step,
  `longest_step_tokens / prefill_tok_s + 1 / decode_tok_s_per_stream` (`stream_silence_s`).
- A stream from an engine silent until its first token (LMDeploy's TurboMind): the wait before that token,
  `queue + prompt / prefill_tok_s + 1 / decode_tok_s_per_stream`, one bound for the whole stream (the later
  gaps are steps, far shorter; a decode step held up by other requests' prefills is within the queue term).
- A non-streamed call (nothing comes before its one body): the whole answer,
  `queue + prompt / prefill_tok_s + max_tokens / decode_tok_s_per_stream` (`max_tokens` absent: the context).

`queue` is the other sessions' prefills, each a whole context (`(sessions - 1) x context / prefill_tok_s`): the
gateway admits a request to the worker only with a slot for it, but in the worker it may still wait behind
prefills the others began first, which steps share. `prompt` is the request body's bytes (a token is at least
one byte in a byte-level tokenizer, and the JSON around the text outweighs the template's tokens), at most the
context: never fewer tokens than the prompt holds. The decode rate is the plan's at every session decoding at
full context, the slowest it promises. Every term is taken at its worst, since a false timeout of a healthy
request loses a whole answer while a late one only waits longer for a dead worker; on a large deployment this
sum may reach `upstream_timeout_s`, which is then the bound, as before.

Kept at `upstream_timeout_s`: a remote endpoint (not ours to judge: no prediction), a model with no
prediction, a vision model (an image's encoding, this request's or another's between steps, is not
predicted), embeddings and rerank calls, and everything when `stream_silence_floor_s` is null. A call silent
past its bound fails as the `upstream_timeout` error naming the model (504, or the error frame mid-stream).
"""

from __future__ import annotations

from typing import Protocol

from backends.base import EngineCapabilities
from backends.request import AnyEngineRequest, EngineRequest


class Prediction(Protocol):
    """What the silence bound reads of the plan's prediction (`gateway.placement.performance.Prediction`)."""

    @property
    def prefill_tok_s(self) -> float: ...

    @property
    def decode_tok_s_per_stream(self) -> float: ...

    @property
    def sessions(self) -> int: ...

    @property
    def context_tokens(self) -> int: ...


SILENCE_MARGIN = 4.0
"""Predictions are within 2x of measurements on the GPU machine (docs/speed-model.md); twice that again."""

PROMPT_BYTES_PER_TOKEN = 1.0
"""The fewest body bytes a prompt token takes (a byte-level tokenizer's token covers at least one byte): the
prompt's tokens are never underestimated, whatever its language."""


def stream_silence_s(
    capabilities: EngineCapabilities, prediction: Prediction | None, *, floor_s: float | None, ceiling_s: float
) -> float:
    """The longest a stream's worker that speaks every step may say nothing (the read timeout of its body)."""
    tokens = capabilities.longest_step_tokens
    if tokens is None or prediction is None or floor_s is None:
        return ceiling_s
    step_s = tokens / prediction.prefill_tok_s + 1.0 / prediction.decode_tok_s_per_stream
    return min(ceiling_s, max(floor_s, SILENCE_MARGIN * step_s))


def read_timeout_s(
    capabilities: EngineCapabilities,
    prediction: Prediction | None,
    request: AnyEngineRequest,
    body_bytes: int,
    *,
    floor_s: float | None,
    ceiling_s: float,
) -> float:
    """The read timeout of one call to a worker: `request`, sent as `body_bytes` bytes (module docstring)."""
    if not _judged(capabilities, prediction, request, floor_s):
        return ceiling_s
    assert prediction is not None and floor_s is not None and isinstance(request, EngineRequest)
    if request.stream and capabilities.longest_step_tokens is not None:
        return stream_silence_s(capabilities, prediction, floor_s=floor_s, ceiling_s=ceiling_s)
    context = prediction.context_tokens
    prompt_tokens = min(context, body_bytes / PROMPT_BYTES_PER_TOKEN)
    output_tokens = 1 if request.stream else min(context, request.max_tokens or context)
    queue_s = max(0, prediction.sessions - 1) * context / prediction.prefill_tok_s
    healthy_s = queue_s + prompt_tokens / prediction.prefill_tok_s + output_tokens / prediction.decode_tok_s_per_stream
    return min(ceiling_s, max(floor_s, SILENCE_MARGIN * healthy_s))


def _judged(
    capabilities: EngineCapabilities, prediction: Prediction | None, request: AnyEngineRequest, floor_s: float | None
) -> bool:
    """Whether a healthy worker's silence on `request` is predicted: else the call keeps the ceiling."""
    if prediction is None or floor_s is None or capabilities.vision or not isinstance(request, EngineRequest):
        return False
    return not request.images and prediction.prefill_tok_s > 0 and prediction.decode_tok_s_per_stream > 0
