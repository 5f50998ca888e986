"""What would make a refused model fit, with numbers: a shorter context (with or without KV int8), more GPUs,
or a smaller source (AWQ/GPTQ for TurboMind W4A16, a GGUF for llama.cpp). Each hint is checked with the same
memory estimates as the ladder, on the memory left for the model. (Fewer sessions need no hint: the ladder's
third tier already serves as many as fit and queues the rest.)"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gateway.placement.estimate import MARGIN_BYTES, LlamaCppFit, Shortfall, TurboMindFit, fit_llamacpp, fit_turbomind
from gateway.placement.inspection import SourceInfo
from gateway.placement.rungs import TM_FP16, ModelWork, Placed, try_turbomind, turbomind_unsupported

AWQ_BITS_PER_WEIGHT = 4.25
"""4-bit weights plus an fp16 scale and zero per group of 128 (embedding and output head stay fp16)."""
GGUF_BITS_PER_WEIGHT = {"Q8_0": 8.5, "Q4_K_M": 4.85}
"""Average bits per weight of llama.cpp's files (Q4_K_M keeps some tensors at Q6_K)."""
HINT_SESSION_STEP = 256


def refusal_hints(work: ModelWork, budgets: dict[int, int], *, no_llamacpp: bool) -> list[str]:
    """Each change that alone (or with KV int8) would place the model on `budgets` (index -> bytes usable,
    margin kept out), or on more GPUs of the kind it has; the first HF float16 source is the reference."""
    hints: list[str] = []
    source = work.fp16[0] if work.fp16 else None
    turbomind = source is not None and turbomind_unsupported(source, 1, work.spec, 0) is None
    if source is not None and turbomind and budgets:
        hints += _turbomind_hints(work, source, budgets)
        if not work.w4a16:
            hints += _awq_hint(work, source, budgets)
    reference = source or (work.w4a16[0] if work.w4a16 else None)
    if reference is not None and not work.ggufs and not no_llamacpp:
        hints.append(_gguf_hint(work, reference, budgets))
    return hints


def _tps(work: ModelWork, budgets: dict[int, int]) -> list[int]:
    spec = work.spec
    if spec.tp is not None:
        return [spec.tp]
    if spec.gpus is not None:
        return [len(spec.gpus)]
    return [tp for tp in (1, 2, 4, 8) if tp <= len(budgets)]


def _fits(work: ModelWork, source: SourceInfo, budgets: dict[int, int], policy: int, n: int, session: int) -> bool:
    return any(
        isinstance(try_turbomind(work, TM_FP16, source, budgets, tp, session, policy=policy, sessions=n), Placed)
        for tp in _tps(work, budgets)
    )


def _turbomind_hints(work: ModelWork, source: SourceInfo, budgets: dict[int, int]) -> list[str]:
    spec = work.spec
    hints: list[str] = []
    policies = [0, 8] if source.shape.head_dim == 128 and spec.lmdeploy.quant_policy is None else [0]
    best_session = 0
    for policy in policies:
        session = _longest(partial(_fits, work, source, budgets, policy, spec.concurrency), spec.context)
        if session > best_session:
            kv = "KV int8 and " if policy == 8 else ""
            hints.append(f"{kv}a context of {session} tokens (min_context: {session})")
            best_session = session
    hints += _more_gpus_hint(work, source)
    return hints


def _longest(fits: Callable[[int], bool], context: int) -> int:
    """The longest multiple of HINT_SESSION_STEP below `context` for which `fits(session)`, or 0."""
    candidates = list(range(HINT_SESSION_STEP, context, HINT_SESSION_STEP))
    best, lo, hi = 0, 0, len(candidates) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def _more_gpus_hint(work: ModelWork, source: SourceInfo) -> list[str]:
    """The fewest identical GPUs (tp 2/4/8, more than the inventory has of that kind) that would hold it."""
    if not work.gpus or work.spec.tp is not None or work.spec.gpus is not None:
        return []
    roomiest = max(work.gpus.values(), key=lambda g: g.free_bytes)
    have = sum(1 for g in work.gpus.values() if g.kind == roomiest.kind)
    for tp in (2, 4, 8):
        if tp <= have or turbomind_unsupported(source, tp, work.spec, 0):
            continue
        if isinstance(_fit_alone(work, source, tp, roomiest.free_bytes), TurboMindFit):
            return [f"{tp} x {roomiest.name} for TurboMind tp {tp} (the inventory has {have})"]
    return []


def _fit_alone(work: ModelWork, source: SourceInfo, tp: int, free_bytes: int) -> TurboMindFit | Shortfall:
    """TurboMind with the configured settings on `tp` GPUs that each show `free_bytes` free."""
    settings = work.spec.lmdeploy
    return fit_turbomind(
        source,
        gpu_indices=tuple(range(tp)),
        free_bytes=free_bytes,
        session_len=work.spec.context,
        concurrency=work.spec.concurrency,
        quant_policy=settings.quant_policy or 0,
        max_batch_size=settings.max_batch_size,
        cache_ratio=settings.cache_max_entry_count,
        prefill_tokens=settings.max_prefill_token_num,
    )


def _scaled(source: SourceInfo, bits: float, keep_ends: bool) -> SourceInfo:
    """The same model at `bits` per weight (embedding and head at 16 bits with `keep_ends`)."""
    ratio = bits / (source.bits_per_weight or 16)
    ends = 1.0 if keep_ends else ratio
    layers = tuple(round(b * ratio) for b in source.layer_bytes)
    embedding, output = round(source.embedding_bytes * ends), round(source.output_bytes * ends)
    total = sum(layers) + embedding + output
    return source.model_copy(
        update={"weights_bytes": total, "layer_bytes": layers, "embedding_bytes": embedding, "output_bytes": output}
    )


def _awq_hint(work: ModelWork, source: SourceInfo, budgets: dict[int, int]) -> list[str]:
    awq = _scaled(source, AWQ_BITS_PER_WEIGHT, keep_ends=True).model_copy(update={"format": "awq"})
    size = f"~{awq.weights_bytes / 1e9:.1f} GB"
    if isinstance(_fit_alone(work, awq, 1, max(budgets.values()) + MARGIN_BYTES), TurboMindFit):
        return [f"an AWQ/GPTQ 4-bit source ({size}) for TurboMind W4A16 on one GPU"]
    return []


def _gguf_hint(work: ModelWork, source: SourceInfo, budgets: dict[int, int]) -> str:
    sizes = {quant: _scaled(source, bits, keep_ends=False) for quant, bits in GGUF_BITS_PER_WEIGHT.items()}
    listed = ", ".join(f"{quant} ~{s.weights_bytes / 1e9:.1f} GB" for quant, s in sizes.items())
    n_ctx = work.spec.context * (work.spec.llamacpp.slots or work.spec.concurrency)
    room = max(budgets.values(), default=0)
    for quant, gguf in sizes.items():
        whole = gguf.shape.n_layers + 1
        fit = fit_llamacpp(gguf, budgets={0: room}, n_ctx_total=n_ctx, n_batch=work.spec.llamacpp.n_batch,
                           n_offload=whole) if room else None  # fmt: skip
        if isinstance(fit, LlamaCppFit):
            size = f"{quant} ~{gguf.weights_bytes / 1e9:.1f} GB"
            return f"a GGUF source would let llama.cpp run it with every layer on the GPU ({size})"
    return f"a GGUF source would let llama.cpp offload part of it or run it on the CPU ({listed})"
