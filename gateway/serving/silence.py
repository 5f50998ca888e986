"""How long a worker may send nothing on an open stream before the gateway ends it (issue 35 item 7).

A worker whose HTTP server answers while its engine is stuck (a wedged GPU kernel, a scheduler that lost a
sequence) passes its health check, so the frozen-worker watchdog never fires; its streams would hang until
`server.upstream_timeout_s` (600 s). Our llama.cpp worker says something at least once per engine step: an
SSE comment every 0.5 s before a stream's first token (waiting for a slot, a grammar, the prefill), then a chunk
per step, and a step is at most `n_batch` tokens (the decodes plus a prompt chunk). So the longest silence of a
healthy worker is one step, which the plan predicts:

    step_s    = longest_step_tokens / prefill_tok_s + 1 / decode_tok_s_per_stream
    silence_s = min(upstream_timeout_s, max(server.stream_silence_floor_s, SILENCE_MARGIN x step_s))

A stream silent that long ends with the `upstream_timeout` error frame naming the model. An engine that may be
silent for a whole prefill (LMDeploy sends nothing before its first token, a remote endpoint is not ours to
judge, a vision step encodes images between steps) declares no `longest_step_tokens` and keeps
`upstream_timeout_s`; so does a model with no prediction, or `stream_silence_floor_s: null`.
"""

from __future__ import annotations

from typing import Protocol

from backends.base import EngineCapabilities


class Prediction(Protocol):
    """What the silence bound reads of the plan's prediction (`gateway.placement.performance.Prediction`)."""

    @property
    def prefill_tok_s(self) -> float: ...

    @property
    def decode_tok_s_per_stream(self) -> float: ...


SILENCE_MARGIN = 4.0
"""Predictions are within 2x of measurements on the GPU machine (docs/speed-model.md); twice that again."""


def stream_silence_s(
    capabilities: EngineCapabilities, prediction: Prediction | None, *, floor_s: float | None, ceiling_s: float
) -> float:
    """The longest a stream's worker may say nothing (the read timeout of its body)."""
    tokens = capabilities.longest_step_tokens
    if tokens is None or prediction is None or floor_s is None:
        return ceiling_s
    step_s = tokens / prediction.prefill_tok_s + 1.0 / prediction.decode_tok_s_per_stream
    return min(ceiling_s, max(floor_s, SILENCE_MARGIN * step_s))
