"""LMDeploy TurboMind (FP16, continuous batching): `lmdeploy serve api_server` as a supervised subprocess.

The argv is computed from the plan so that tests can assert it exactly; requests are translated into
the dialect LMDeploy's OpenAI server accepts, and its error bodies normalised to OpenAI's shape.
"""

from __future__ import annotations

import os
import shutil
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
from backends.overflow import overflow_counts, overflow_message
from backends.request import IMAGE_MARKER, AnyEngineRequest, EngineImage, EngineRequest, NamedToolChoice

DISABLE_METRICS = "--disable-metrics"
INSTALL_HINT = "install it with: pip install 'voltgate[lmdeploy]' (needs CUDA 12; see README, 'V100 hardware')"

# Fields of the engine request that LMDeploy's api_server does not take as they are (its own `session_id` is an
# interactive-mode integer, not a routing key: voltgate's `session_key` is not sent). LMDeploy has no thinking
# budget: TurboMind honours thinking on or off (`chat_template_kwargs`) only (docs/reasoning.md).
_DROP = {
    "stream_options",
    "continue_final_message",
    "ignore_eos_default",
    "session_key",
    "thinking_budget_tokens",
    "thinking_budget_message",
}


class LMDeployNotInstalled(Exception):
    """The lmdeploy executable was not found: reported at plan time, not at request time."""


def find_lmdeploy(executable: str) -> str:
    """Resolve the lmdeploy CLI on PATH (or an absolute path), or raise `LMDeployNotInstalled`."""
    path = executable if os.path.isabs(executable) else shutil.which(executable)
    if not path or not os.access(path, os.X_OK):
        raise LMDeployNotInstalled(f"LMDeploy executable {executable!r} not found; {INSTALL_HINT}")
    return path


class LMDeployAdapter:
    engine: ClassVar[EngineName] = EngineName.LMDEPLOY

    def capabilities(self, plan: DeploymentPlan) -> EngineCapabilities:
        """Tools need one of LMDeploy's tool-call parsers, chosen by the plan from the architecture; images need
        an architecture whose vision tower TurboMind runs (`plan.vision_encoder`, set by the placement)."""
        kinds = frozenset({RequestKind.CHAT, RequestKind.COMPLETION})
        # Its /v1/completions answers `logprobs: null` whatever is asked (probed live, 0.18): refused there.
        return EngineCapabilities(
            kinds=kinds,
            json_schema=True,
            tools=plan.tool_parser is not None,
            logprobs=True,
            completion_logprobs=False,
            vision=plan.vision_encoder is not None,
            # TurboMind counts a request's prefix-cache hit only with its metrics on (`_get_metrics` in
            # lmdeploy/turbomind/turbomind.py), LMDeploy 0.18's default; `--disable-metrics` leaves a 0 that was
            # never measured, so the count is then removed (docs/api.md).
            cached_tokens=plan.lmdeploy.extra_value(DISABLE_METRICS) is None,
        )

    def __init__(self, startup_timeout_s: float = 900.0) -> None:
        self._startup_timeout_s = startup_timeout_s

    def launch_spec(self, plan: DeploymentPlan, port: int) -> LaunchSpec:
        opts = plan.lmdeploy
        model_format = "hf" if plan.model_format in ("hf", "gguf") else plan.model_format
        argv = [
            find_lmdeploy(opts.executable), "serve", "api_server", str(plan.source_path),
            "--backend", "turbomind",
            "--model-format", model_format,
            "--dtype", "float16",
            "--tp", str(plan.tp),
            "--session-len", str(plan.context_tokens),
            "--max-batch-size", str(plan.max_batch_size or plan.slots),
            "--cache-max-entry-count", f"{plan.cache_max_entry_count if plan.cache_max_entry_count else 0.8:g}",
            "--quant-policy", str(plan.quant_policy),
            "--server-name", "127.0.0.1",
            "--server-port", str(port),
            "--model-name", plan.model,
        ]  # fmt: skip
        if prefix_caching(plan):
            argv.append("--enable-prefix-caching")
        if plan.tool_parser is not None:
            argv += ["--tool-call-parser", plan.tool_parser]
        if plan.reasoning_parser is not None:
            argv += ["--reasoning-parser", plan.reasoning_parser]
        if opts.max_prefill_token_num is not None:
            argv += ["--max-prefill-token-num", str(opts.max_prefill_token_num)]
        argv += list(opts.extra_args)
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONUNBUFFERED": "1"}
        if plan.gpu_indices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in plan.gpu_indices)
        return LaunchSpec(
            argv=tuple(argv),
            env=env,
            health_path="/v1/models",
            startup_timeout_s=self._startup_timeout_s,
            # docs/hardware.md: on a card too small TurboMind either aborts or loops on this line forever.
            fatal_log_patterns=(r"out of memory at \d+/\d+", r"CUDA error: out of memory"),
        )

    def translate_request(self, request: AnyEngineRequest) -> dict[str, Any]:
        if not isinstance(request, EngineRequest):
            return request.wire()  # OpenAI's embeddings body (TurboMind serves none: refused by `capabilities`)
        out = {k: v for k, v in request.wire().items() if k not in _DROP}
        if request.images:
            out.pop("images")
            out["messages"] = image_messages(out["messages"], request.images)
        if request.stream:
            # LMDeploy >= 0.7 understands stream_options; always ask for usage (the gateway strips it).
            out["stream_options"] = {"include_usage": True}
        fmt = request.response_format
        if request.is_chat and fmt is not None and fmt.type == "json_object":
            # TurboMind's guided decoding takes a JSON schema; an open object schema is json mode.
            out["response_format"] = {"type": "json_schema", "json_schema": {"name": "json_object",
                                      "schema": {"type": "object"}}}  # fmt: skip
        if not request.is_chat:
            out.pop("response_format", None)
        if request.top_p == 0:  # OpenAI's minimum; TurboMind's GenerationConfig wants top_p > 0
            out.pop("top_p")
            out["top_k"] = 1  # the same rule: only the most likely token is kept
        if isinstance(request.tool_choice, NamedToolChoice):
            # LMDeploy 0.18 does not honour a named tool_choice (probed live: it answers in text), but it
            # enforces "required": offered only the named tool, "required" is the named choice.
            out["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in request.active_tools]
            out["tool_choice"] = "required"
        return out

    def normalize_error(self, status: int, body: bytes) -> UpstreamError:
        err = normalize_openai_error(status, body)
        # LMDeploy answers over-long prompts with a plain 400 whose code is just "invalid_request_error"
        # (seen live, 0.18: "Input length (6010) must be smaller than the model context length (1024).";
        # older releases say "exceed session_len"); give it OpenAI's code so clients can react.
        text = err.message.lower()
        if "context length" in text or "session_len" in text or ("exceed" in text and "length" in text):
            counts = overflow_counts(err.message)
            if counts is not None:  # in OpenAI's words, which clients match
                err.message = overflow_message(counts[1], counts[0])
            err.code = "context_length_exceeded"
            err.param = err.param or "messages"
            err.status = 400
        if err.code is not None and err.code.isdigit():
            err.code = None  # LMDeploy puts its integer ErrorCode here; not meaningful to clients
        return err


def prefix_caching(plan: DeploymentPlan) -> bool:
    """Whether TurboMind runs this plan with prefix caching (`--enable-prefix-caching`, off in LMDeploy by default).

    On unless the model's config turns it off: LMDeploy 0.18 supports it for every plan voltgate makes. It is
    a scheduler feature, independent of the GPU architecture (sm_70 included); it works with KV int8/int4
    (`quant_policy`) and with tp > 1; the vision models the placement sends to TurboMind encode their images
    in TurboMind (`_turbomind_native_vision`), whose prompts are eligible too (LMDeploy turns it off only for
    Python-side image embeddings). What it refuses (prompt logits for every token, perplexity, interactive
    `step`) voltgate never asks for. docs/engines.md, "Prefix caching", cites the sources.
    """
    return plan.lmdeploy.prefix_caching


def image_messages(messages: list[dict[str, Any]], images: tuple[EngineImage, ...]) -> list[dict[str, Any]]:
    """The wire messages with each `IMAGE_MARKER` turned back into an OpenAI `image_url` part holding the image
    as a data URI (LMDeploy's OpenAI server reads those for a vision model and runs its own preprocessing).

    The images fill the markers in order; a message with markers becomes a list of `text` and `image_url`
    parts (empty text between adjacent images left out), every other message is passed on as it is.
    """
    queue = iter(images)
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or IMAGE_MARKER not in content:
            out.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for i, text in enumerate(content.split(IMAGE_MARKER)):
            if i:
                parts.append({"type": "image_url", "image_url": {"url": next(queue).data_uri()}})
            if text:
                parts.append({"type": "text", "text": text})
        out.append(message | {"content": parts})
    return out
