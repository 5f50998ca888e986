"""`python -m backends.llamacpp.worker`: one GGUF model, many concurrent users, one OpenAI-style HTTP port."""

from __future__ import annotations

# First, before numpy (imported by the embedding modules): llama.cpp's shared libraries. On the GPU machine
# (2026-12-01: CUDA build, Python 3.12, numpy 2.5.2) every process that had imported numpy before llama_cpp
# died with SIGSEGV in llama_model_load_from_file, and every one that imported llama_cpp first loaded
# (bench/gpu/diag_import_order.sh; tests/integration/test_worker_imports.py keeps the order).
import backends.llamacpp.worker.native  # noqa: F401

# isort: split

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import uvicorn

from backends.llamacpp.cpu_features import physical_cores
from backends.llamacpp.worker.auth import require_token
from backends.llamacpp.worker.chat_server import WorkerSpec, create_app
from backends.llamacpp.worker.checkpoints import DEFAULT_CTX_CHECKPOINTS
from backends.llamacpp.worker.embed_server import EmbedSpec
from backends.llamacpp.worker.embed_server import create_app as create_embed_app
from backends.llamacpp.worker.embedding import POOLINGS, EmbeddingOptions, Pooling
from backends.llamacpp.worker.native import ContextOptions
from backends.llamacpp.worker.prompt_cache import (
    DEFAULT_PROMPT_CACHE_MIB,
    IDLE_SAVE_AFTER_S,
    LONG_PROMPT_TOKENS_CPU,
    LONG_PROMPT_TOKENS_GPU,
    SavePolicy,
)
from backends.llamacpp.worker.slow_lane import DEFAULT_GRAMMAR_STEP_LIMIT_S

log = logging.getLogger("voltgate.worker")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not >= 0")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not >= 0")
    return value


def _auto_or_non_negative(text: str) -> int | str:
    return text if text == "auto" else _non_negative(text)


def _long_prompt_tokens(args: argparse.Namespace) -> int:
    if args.prompt_cache_min_tokens != "auto":
        return int(args.prompt_cache_min_tokens)
    return LONG_PROMPT_TOKENS_GPU if args.n_gpu_layers != 0 else LONG_PROMPT_TOKENS_CPU


def build_parser() -> argparse.ArgumentParser:
    """The worker's flags, in --help's order: what it serves and where, how it decodes, which task."""
    p = argparse.ArgumentParser(prog="python -m backends.llamacpp.worker", description=__doc__)
    _serving_args(p)
    _decoding_args(p)
    _cache_args(p)
    _task_args(p)
    return p


def _serving_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, type=Path, help="GGUF file")
    p.add_argument("--model-name", required=True, help="the name clients use in `model`")
    p.add_argument(
        "--mmproj",
        type=Path,
        default=None,
        help="multimodal projector GGUF (llama.cpp's mmproj): requests may carry images",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--ctx", required=True, type=_positive, help="context tokens per slot (per sequence)")
    p.add_argument("--slots", required=True, type=_positive, help="sequences decoded together")
    p.add_argument("--n-gpu-layers", type=int, default=0, help="layers offloaded to the GPU (-1 = all)")
    p.add_argument("--n-cpu-moe", type=int, default=0,
                   help="a MoE's routed experts of the first N layers stay in host memory (-1 = all)")  # fmt: skip


def _decoding_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--n-threads",
        type=_positive,
        default=None,
        help="CPU threads (default: one per physical core this process may use, as llama-server)",
    )
    p.add_argument("--n-batch", type=_positive, default=512, help="tokens per decode step (prefill chunk budget)")
    p.add_argument("--no-flash-attn", dest="flash_attn", action="store_false", help="disable flash attention")
    p.add_argument("--max-queue", type=_non_negative, default=64, help="requests waiting for a slot before 429")
    p.add_argument(
        "--cache-type",
        choices=["auto", "f16", "bf16", "q8_0", "f32"],
        default="auto",
        help="KV cache type; auto = bf16 on CPU (batch-invariant numerics), f16 when layers are on a GPU",
    )
    p.add_argument(
        "--kv-unified",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="one KV buffer shared by all slots instead of one stream per slot (default); unified breaks "
        "batch-invariance, since a sequence's cells stop being in position order",
    )
    p.add_argument(
        "--fill-gaps",
        choices=["auto", "on", "off"],
        default="auto",
        help="give idle slots between busy ones a throwaway token so each step stays one forward pass "
        "(llama.cpp splits a step at every gap in the busy slot ids); auto = on when layers are on a GPU, "
        "where the extra token is nearly free",
    )
    p.add_argument(
        "--sampling-threads",
        type=_positive,
        default=1,
        help="threads running the sampler chains of one step in parallel (temperature/top_p/penalties/grammar "
        "requests; plain greedy needs none); same tokens as 1",
    )


def _cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt-cache-mib",
        type=_non_negative,
        default=DEFAULT_PROMPT_CACHE_MIB,
        help="host memory (MiB) for the KV of slots a new prompt overwrites, restored when a later prompt "
        "shares more with it than with any free slot (like llama-server's --cache-ram); 0 = off",
    )
    p.add_argument(
        "--prompt-cache-min-tokens",
        type=_auto_or_non_negative,
        default="auto",
        help="a prompt at least this long is worth a copy of its KV to host memory even before it is reused "
        f"(reused prefixes and named sessions always are); auto = {LONG_PROMPT_TOKENS_CPU} on the CPU, "
        f"{LONG_PROMPT_TOKENS_GPU} when layers are on a GPU, where the copy costs about a short prompt's prefill",
    )
    p.add_argument(
        "--prompt-cache-idle-s",
        type=_non_negative_float,
        default=IDLE_SAVE_AFTER_S,
        help="seconds the engine idles before it copies a slot worth keeping to host memory: an agent's turn that "
        "comes back sooner finds its slot untouched and waits for no copy (a slot a prompt overwrites is still "
        "saved first); 0 = at once",
    )
    p.add_argument(
        "--ctx-checkpoints",
        type=_non_negative,
        default=DEFAULT_CTX_CHECKPOINTS,
        help="recurrent/hybrid models only (Mamba, Qwen3-Next): copies of a slot's recurrent state kept per slot "
        "near the end of each prompt, so a later prompt that shares most of it is not prefilled whole (like "
        "llama-server's --ctx-checkpoints); 0 = off",
    )
    p.add_argument(
        "--grammar-step-limit-s",
        type=float,
        default=DEFAULT_GRAMMAR_STEP_LIMIT_S,
        help="a large grammar (over 32 KiB of GBNF, sampled off the engine step) that takes longer than this to "
        "give one token is refused with a 400, and the same grammar again at once",
    )


def _task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task",
        choices=["generate", "embed", "rerank"],
        default="generate",
        help="generate: chat/completions; embed: /v1/embeddings; rerank: /v1/rerank. For embed and rerank, "
        "--ctx is the longest input, --slots the inputs per forward pass, --n-batch the tokens per pass",
    )
    p.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=None,
        help="embed/rerank: override the GGUF's pooling type (rerank defaults to rank)",
    )
    p.add_argument(
        "--matryoshka",
        action="store_true",
        help="embed: the model's vectors may be truncated, so requests may ask for `dimensions`",
    )


def _threads(args: argparse.Namespace) -> int:
    """--n-threads, or one per physical core, as llama-server (`cpu_features.physical_cores`; half the logical
    cores before 2026-12-06, which gave a 16-vCPU VM without SMT 8 threads where llama-server took 16)."""
    return int(args.n_threads or physical_cores())


def _cache_type(args: argparse.Namespace) -> str:
    """--cache-type; auto = bf16 on the CPU (batch-invariant numerics), f16 when layers are on a GPU."""
    if args.cache_type != "auto":
        return str(args.cache_type)
    return "bf16" if args.n_gpu_layers == 0 else "f16"


def spec_from_args(args: argparse.Namespace) -> WorkerSpec:
    return WorkerSpec(
        model_path=args.model,
        model_name=args.model_name,
        context=ContextOptions(
            n_ctx_per_seq=args.ctx,
            n_seq_max=args.slots,
            n_batch=max(args.n_batch, args.slots),
            n_threads=_threads(args),
            n_gpu_layers=args.n_gpu_layers,
            flash_attn=args.flash_attn,
            kv_unified=args.kv_unified,
            cache_type=_cache_type(args),
            n_cpu_moe=args.n_cpu_moe,
        ),
        max_queue=args.max_queue,
        fill_gaps=args.fill_gaps == "on" or (args.fill_gaps == "auto" and args.n_gpu_layers != 0),
        sampling_threads=args.sampling_threads,
        prompt_cache_mib=args.prompt_cache_mib,
        save_policy=SavePolicy(_long_prompt_tokens(args), args.prompt_cache_idle_s),
        ctx_checkpoints=args.ctx_checkpoints,
        grammar_step_limit_s=args.grammar_step_limit_s,
        mmproj=args.mmproj,
    )


def embed_spec_from_args(args: argparse.Namespace) -> EmbedSpec:
    """The worker's command line (`--task embed|rerank`) as an `EmbedSpec`.

    `--ctx` is the longest input, `--slots` the inputs per forward pass, `--n-batch` the tokens per pass.
    A reranker gets pooling rank unless `--pooling` says otherwise.
    """
    pooling: Pooling | None = args.pooling or ("rank" if args.task == "rerank" else None)
    return EmbedSpec(
        model_path=args.model,
        model_name=args.model_name,
        task=args.task,
        options=EmbeddingOptions(
            max_input_tokens=args.ctx,
            n_seq_max=args.slots,
            n_batch=max(args.n_batch, args.ctx),
            n_threads=_threads(args),
            n_gpu_layers=args.n_gpu_layers,
            flash_attn=args.flash_attn,
            pooling=pooling,
            cache_type=_cache_type(args),
        ),
        max_queue=args.max_queue,
        matryoshka=args.matryoshka,
    )


class _Server(uvicorn.Server):
    """uvicorn, plus: a stop signal also ends in-flight requests at once (each gets an error event)."""

    def __init__(self, config: uvicorn.Config, begin_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._begin_shutdown = begin_shutdown

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._begin_shutdown()
        super().handle_exit(sig, frame)


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("worker: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.task == "generate" and (args.pooling or args.matryoshka):
        parser.error("--pooling and --matryoshka need --task embed or rerank")
    _configure_logging()
    spec = spec_from_args(args)
    if not spec.model_path.is_file():
        log.error("model file %s not found", spec.model_path)
        return 2
    if spec.mmproj is not None and not spec.mmproj.is_file():
        log.error("mmproj file %s not found", spec.mmproj)
        return 2
    failure: list[str] = []

    def on_fatal(reason: str) -> None:
        failure.append(reason)
        server.should_exit = True

    app = (
        create_app(spec, on_fatal)
        if args.task == "generate"
        else create_embed_app(embed_spec_from_args(args), on_fatal)
    )
    config = uvicorn.Config(
        require_token(app.asgi, os.environ),  # a worker other hosts reach needs its launch secret
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = _Server(config, app.begin_shutdown)
    log.info("listening on http://%s:%d, loading %s", args.host, args.port, spec.model_path)
    server.run()
    if failure:
        log.error("exiting: %s", failure[0])
        return 1
    return 0
