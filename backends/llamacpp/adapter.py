"""How the gateway launches and speaks to our llama.cpp worker (`python -m backends.llamacpp.worker`).

A generation plan starts the continuous-batching chat worker; an embed or rerank plan the pooled-output
worker (`--task embed|rerank`), where `--ctx` is the longest input and `--slots` the inputs per forward pass.
"""

from __future__ import annotations

import os
import sys
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
from backends.request import AnyEngineRequest


class LlamaCppAdapter:
    engine: ClassVar[EngineName] = EngineName.LLAMACPP

    def capabilities(self, plan: DeploymentPlan) -> EngineCapabilities:
        """A generation worker serves chat and completions; an embed worker only embeddings (`dimensions` when
        matryoshka), a rerank worker only rerank."""
        if plan.task == "embed":
            return EngineCapabilities(kinds=frozenset({RequestKind.EMBEDDING}), json_mode=False,
                                      dimensions=plan.matryoshka)  # fmt: skip
        if plan.task == "rerank":
            return EngineCapabilities(kinds=frozenset({RequestKind.RERANK}), json_mode=False, dimensions=False)
        kinds = frozenset({RequestKind.CHAT, RequestKind.COMPLETION})
        vision = plan.mmproj is not None  # images only through a projector
        step = None if vision else plan.llamacpp.n_batch  # an image is encoded between steps, for unmeasured time
        return EngineCapabilities(kinds=kinds, json_schema=True, tools=True, logprobs=True, dimensions=False,
                                  vision=vision, longest_step_tokens=step)  # fmt: skip

    def __init__(self, python: str = sys.executable, startup_timeout_s: float = 600.0) -> None:
        self._python = python
        self._startup_timeout_s = startup_timeout_s

    def launch_spec(self, plan: DeploymentPlan, port: int) -> LaunchSpec:
        opts = plan.llamacpp
        argv = [
            self._python, "-m", "backends.llamacpp.worker",
            "--model", str(plan.source_path),
            "--model-name", plan.model,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--ctx", str(plan.context_tokens),
            "--slots", str(plan.slots),
            "--n-gpu-layers", str(plan.n_gpu_layers),
            "--n-batch", str(opts.n_batch),
            "--max-queue", str(opts.max_queue),
        ]  # fmt: skip
        if opts.n_threads is not None:
            argv += ["--n-threads", str(opts.n_threads)]
        if plan.n_cpu_moe != 0 and plan.task == "generate":
            argv += ["--n-cpu-moe", str(plan.n_cpu_moe)]
        if opts.prompt_cache_mib is not None:
            argv += ["--prompt-cache-mib", str(opts.prompt_cache_mib)]
        if opts.prompt_cache_idle_s is not None and plan.task == "generate":
            argv += ["--prompt-cache-idle-s", f"{opts.prompt_cache_idle_s:g}"]
        if opts.ctx_checkpoints is not None and plan.task == "generate":
            argv += ["--ctx-checkpoints", str(opts.ctx_checkpoints)]
        if opts.grammar_step_limit_s is not None and plan.task == "generate":
            argv += ["--grammar-step-limit-s", f"{opts.grammar_step_limit_s:g}"]
        if not opts.flash_attn:
            argv.append("--no-flash-attn")
        if plan.kv_cache_type != "f16":  # f16 stays the worker's "auto" (bf16 on the CPU for batch-invariance)
            argv += ["--cache-type", plan.kv_cache_type]
        elif opts.cache_type is not None:  # a 16-bit type pinned in the config
            argv += ["--cache-type", opts.cache_type]
        if plan.mmproj is not None and plan.task == "generate":
            argv += ["--mmproj", str(plan.mmproj)]
        if plan.task != "generate":
            argv += ["--task", plan.task]
            if plan.pooling is not None:
                argv += ["--pooling", plan.pooling]
            if plan.matryoshka:
                argv.append("--matryoshka")
        env = {"PYTHONUNBUFFERED": "1"}
        if plan.gpu_indices:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in plan.gpu_indices)
        elif plan.n_gpu_layers == 0:
            env["CUDA_VISIBLE_DEVICES"] = ""
        # The worker imports `backends`, which must resolve to this checkout/installation.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
        return LaunchSpec(
            argv=tuple(argv),
            env=env,
            health_path="/health",
            startup_timeout_s=self._startup_timeout_s,
            fatal_log_patterns=(
                r"failed to load model",
                r"CUDA error: out of memory",
                r"failed to load the multimodal",
            ),
        )

    def translate_request(self, request: AnyEngineRequest) -> dict[str, Any]:
        """Our workers validate the body with the same models (`backends.request`), whatever its kind."""
        return request.wire()

    def normalize_error(self, status: int, body: bytes) -> UpstreamError:
        return normalize_openai_error(status, body)
