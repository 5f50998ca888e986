"""The adapter interface every engine implements, and the plan/launch types it consumes and produces."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from backends.request import AnyEngineRequest
from backends.request import RequestKind as RequestKind  # defined with the requests; imported from here too


class EngineName(StrEnum):
    """The worker kinds voltgate can start."""

    LLAMACPP = "llamacpp"
    LMDEPLOY = "lmdeploy"
    REMOTE = "remote"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PROMPT_CACHE_MIB = 2048
"""The llama.cpp worker's host prompt cache by default (worker `--prompt-cache-mib`, the same default)."""


class LlamaCppOptions(_Frozen):
    """llama.cpp engine settings a user may pin in the config; `None` lets the planner decide."""

    n_threads: int | None = Field(default=None, ge=1, description="CPU threads (default: all cores)")
    n_batch: int = Field(default=512, ge=16, description="tokens decoded per llama_decode call")
    slots: int | None = Field(default=None, ge=1, le=256, description="parallel sequences (continuous batching)")
    n_gpu_layers: int | None = Field(default=None, ge=-1, description="-1 = all; default from the plan")
    n_cpu_moe: int = Field(
        default=0,
        ge=-1,
        description="a MoE's routed experts of the first N layers stay in host memory while the "
        "rest of those layers is on the GPU (llama.cpp's --n-cpu-moe; -1 = every layer's experts)",
    )
    flash_attn: bool = True
    max_queue: int = Field(default=64, ge=0, description="requests waiting for a free slot before 429")
    prompt_cache_mib: int | None = Field(
        default=None,
        ge=0,
        description="host memory (MiB) for the KV of slots a new prompt overwrites, restored when a later "
        "prompt shares more with it (llama-server's --cache-ram); 0 = off; default 2048, cut by the plan to half "
        "the host memory the model leaves",
    )
    prompt_cache_idle_s: float | None = Field(
        default=None,
        ge=0,
        description="seconds the worker idles before it copies a slot worth keeping to host memory (an agent's "
        "turn back sooner waits for no copy; worker --prompt-cache-idle-s); 0 = at once; default the worker's (2 s)",
    )
    ctx_checkpoints: int | None = Field(
        default=None,
        ge=0,
        description="recurrent/hybrid models only (Qwen3-Next, Granite-4.0-H): copies of a slot's recurrent state "
        "kept per slot near each prompt's end so a later prompt sharing most of it is not prefilled whole "
        "(worker --ctx-checkpoints, llama-server's --ctx-checkpoints); 0 = off; default the worker's (4)",
    )
    grammar_step_limit_s: float | None = Field(
        default=None,
        gt=0,
        description="the longest one token of a large grammar (a response_format schema or tools over 32 KiB of "
        "GBNF) may take to sample; over it the request is refused with a 400 and the same grammar again at "
        "once (worker --grammar-step-limit-s); default the worker's (10 s)",
    )
    cache_type: Literal["bf16", "f16"] | None = Field(
        default=None,
        description="the 16-bit KV cache type (worker --cache-type); default: the worker's (bf16 on the CPU, so "
        "a request's text is the same alone or batched; f16 on a GPU). f16 on a CPU without AVX512-BF16 "
        "prefills long prompts several times faster, at the cost of that bit-equality; a q8_0 plan stays q8_0",
    )


class LMDeployOptions(_Frozen):
    """TurboMind engine settings a user may pin in the config; `None` lets the planner decide."""

    executable: str = Field(default="lmdeploy", description="lmdeploy CLI on PATH, or an absolute path")
    max_batch_size: int | None = Field(default=None, ge=1)
    cache_max_entry_count: float | None = Field(default=None, gt=0, le=1)
    quant_policy: Literal[0, 4, 8] | None = None
    max_prefill_token_num: int | None = Field(default=None, ge=256)
    tool_parser: str | None = Field(default=None, description="--tool-call-parser (default: from the architecture)")
    prefix_caching: bool = Field(
        default=True,
        description="--enable-prefix-caching: reuse the KV blocks of a prompt prefix seen before (docs/engines.md, "
        "'Prefix caching'); false turns it off for this model",
    )
    reasoning_parser: str | None = Field(
        default=None, description="--reasoning-parser (default: from the model family; docs/reasoning.md)"
    )
    extra_args: tuple[str, ...] = ()

    def extra_value(self, flag: str) -> str | None:
        """What `extra_args` gives `flag` (`--flag value` or `--flag=value`; the last one wins, as in LMDeploy's
        argparse): its value, "" for a flag with none, None where it is not there."""
        words = [w for arg in self.extra_args for w in arg.replace("=", " ", 1).split()]
        found = None
        for i, word in enumerate(words):
            if word == flag:
                after = words[i + 1] if i + 1 < len(words) else ""
                found = "" if after.startswith("--") else after
        return found


ModelFormat = Literal["gguf", "hf", "awq", "gptq", "remote"]


class DeploymentPlan(_Frozen):
    """Everything needed to start one model's worker: the placement policy's output, an engine's input."""

    model: str
    engine: EngineName
    source_path: Path
    model_format: ModelFormat
    quant: str | None = None
    dtype: Literal["float16", "auto"] = "float16"
    gpu_indices: tuple[int, ...] = ()
    tp: int = 1
    context_tokens: int = Field(
        ge=16, description="tokens per session (llama.cpp n_ctx per slot, TurboMind session_len)"
    )
    slots: int = Field(default=1, ge=1, description="sequences served at once")
    n_gpu_layers: int = 0
    n_cpu_moe: int = Field(default=0, ge=-1, description="llama.cpp MoE: routed experts of the first N layers in "
                           "host memory (-1: all)")  # fmt: skip
    cache_max_entry_count: float | None = None
    quant_policy: Literal[0, 4, 8] = 0
    max_batch_size: int | None = None
    llamacpp: LlamaCppOptions = LlamaCppOptions()
    lmdeploy: LMDeployOptions = LMDeployOptions()
    remote_url: str | None = Field(default=None, description="root URL of an already-running OpenAI endpoint")
    remote_model: str | None = Field(default=None, description="the model's name at that endpoint")
    tool_parser: str | None = Field(default=None, description="LMDeploy --tool-call-parser for the architecture")
    reasoning_parser: str | None = Field(default=None, description="LMDeploy --reasoning-parser for the family")
    kv_cache_type: Literal["f16", "q8_0"] = Field(
        default="f16", description="llama.cpp KV cache type; q8_0 halves it (needs flash attention)"
    )
    task: Literal["generate", "embed", "rerank"] = Field(
        default="generate",
        description="embed/rerank: a llama.cpp pooled-output worker; context_tokens is then the longest input "
        "and slots the inputs per forward pass",
    )
    pooling: Literal["mean", "cls", "last", "rank"] | None = Field(
        default=None, description="embed/rerank: override the GGUF's pooling type"
    )
    matryoshka: bool = Field(default=False, description="embed: vectors may be cut to `dimensions`")
    embed_truncate: bool = Field(default=False, description="embed: cut over-long inputs instead of refusing them")
    mmproj: Path | None = Field(default=None, description="llama.cpp: the multimodal projector (images in chat)")
    vision_encoder: str | None = Field(
        default=None,
        description="TurboMind: the vision tower LMDeploy runs in TurboMind for this architecture (e.g. "
        "'Qwen2-VL ViT'); None: text only (images refused)",
    )


class LaunchSpec(_Frozen):
    """How to start a worker process and how to tell that it is ready."""

    argv: tuple[str, ...]
    env: dict[str, str] = {}
    health_path: str = "/health"
    startup_timeout_s: float = 600.0
    fatal_log_patterns: tuple[str, ...] = ()


class UpstreamError(Exception):
    """An error answered by a worker, normalised to OpenAI's fields."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


class EngineCapabilities(_Frozen):
    """What a deployment can honour, so unsupported parameters are refused before they reach it.

    Shown on `/v1/models` (the `capabilities` extension field) from the plan.
    """

    kinds: frozenset[RequestKind]
    json_mode: bool = True
    json_schema: bool = False
    logprobs: bool = False
    completion_logprobs: bool = True
    tools: bool = False
    vision: bool = False
    dimensions: bool = True
    """/v1/embeddings honours `dimensions` (a remote endpoint answers for itself; ours only for matryoshka)."""
    longest_step_tokens: int | None = None
    """Its streams say something at least once per engine step of at most this many tokens (heartbeats before
    the first token), so a longer silence is a stuck engine (`gateway.serving.silence`); None: a stream may be
    silent for a whole prefill."""
    cached_tokens: bool = True
    """Its usage's `prompt_tokens_details.cached_tokens` is measured (our worker's count; a remote endpoint's,
    as it sends it). False: the details are removed before a client sees them (docs/api.md, "Cached tokens")."""

    def public(self) -> dict[str, bool]:
        return {
            "chat": RequestKind.CHAT in self.kinds,
            "completions": RequestKind.COMPLETION in self.kinds,
            "embeddings": RequestKind.EMBEDDING in self.kinds,
            "rerank": RequestKind.RERANK in self.kinds,
            "tools": self.tools,
            "json_schema": self.json_schema,
            "logprobs": self.logprobs,
            "vision": self.vision,
        }


class EngineAdapter(Protocol):
    """One engine's differences from the others: how to launch it and how to speak to it.

    Adapters are mostly pure so tests can assert on argv/env and on translated bodies; the process
    lifecycle is shared by every engine (`gateway.lifecycle`, docs/lifecycle.md).
    """

    engine: ClassVar[EngineName]

    def capabilities(self, plan: DeploymentPlan) -> EngineCapabilities:
        """What this engine can honour for the deployment `plan` describes."""
        ...

    def launch_spec(self, plan: DeploymentPlan, port: int) -> LaunchSpec: ...

    def translate_request(self, request: AnyEngineRequest) -> dict[str, Any]:
        """The JSON body the engine's HTTP server accepts for `request` (already validated), of any kind: chat,
        completion, embedding or rerank all go through here (it goes to `ENGINE_PATHS[request.kind]`)."""
        ...

    def normalize_error(self, status: int, body: bytes) -> UpstreamError: ...


def normalize_openai_error(status: int, body: bytes) -> UpstreamError:
    """Read an OpenAI-shaped (or FastAPI-shaped, or plain text) error body into an `UpstreamError`."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return UpstreamError(status, body.decode("utf-8", "replace").strip()[:500] or f"upstream status {status}")
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail") or json.dumps(err)[:500]
            code = err.get("code")
            param = err.get("param")
            return UpstreamError(
                status,
                str(message),
                code=str(code) if code is not None else None,
                param=str(param) if param is not None else None,
            )
        if isinstance(err, str):
            return UpstreamError(status, err)
    return UpstreamError(status, json.dumps(data)[:500])
