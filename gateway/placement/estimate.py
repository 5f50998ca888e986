"""Memory estimates with named terms, per engine, calibrated on docs/hardware.md's measurements (the constants)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, computed_field

from backends.base import EngineName
from gateway.placement.inspection import ModelShape, SourceInfo
from gateway.placement.inventory import GIB, MIB
from gateway.placement.vision import VisionTower, vision_activation_bytes

MARGIN_BYTES = 1 * GIB
"""Left unused on every GPU: docs/hardware.md asks for at least 1 GiB."""

# --- TurboMind (lmdeploy 0.18), measured on an H200 held to a V100's memory (docs/hardware.md) -------------------
TM_FIXED_BYTES_TP1 = 960 * MIB
"""CUDA context, cuBLAS and buffers beyond the weights, before the KV cache: 32,510 - 12,856 - 18,694 MiB."""
TM_FIXED_BYTES_TP = 1_250 * MIB
"""The same per GPU with tp > 1 (NCCL too): Llama-2-13B tp 2, 16,160 - 12,413 - 2,498 MiB."""
TM_DEFAULT_RATIO = 0.8
"""lmdeploy's default --cache-max-entry-count; measured to serve. Extra KV never goes beyond it."""
TM_BLOCK_TOKENS = 64
TM_MAX_BATCH = 128
TM_DEFAULT_PREFILL_TOKENS = 8_192
TM_KV_HEADROOM = 1.10
"""KV budget = sessions x 1.10, so a full set of sessions never sits at the last block."""

# --- llama.cpp (llama-cpp-python 0.3.36, CUDA, flash attention, n_ubatch 512) ----------------------------
LLAMACPP_CUDA_CONTEXT_BYTES = 672 * MIB
"""CUDA context + cuBLAS workspace per GPU. With `llamacpp_compute_bytes` this reproduces docs/hardware.md's
Llama-2-7B table (F16/Q8_0/Q4_K_M, 4k/16k context, 32 or 16 layers) at +0.1% to +3%, never below it."""
LLAMACPP_MAX_UBATCH = 512


class MemoryEstimate(BaseModel):
    """What one deployment holds, by named term (bytes, summed over wherever it lives), and where it
    lives: `gpu_bytes` per GPU index (margin excluded) and `host_bytes` in host memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineName
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    runtime_bytes: int = Field(default=0, description="TurboMind activations/workspace; llama.cpp compute buffers")
    vision_encoder_bytes: int = Field(
        default=0,
        description="TurboMind: the image encoder's weights and its activations for the largest image; llama.cpp: "
        "the multimodal projector's weights (its GGUF's size)",
    )
    cuda_context_bytes: int = 0
    margin_bytes: int = Field(default=0, description="kept free on the GPUs used (per GPU x GPUs)")
    gpu_bytes: dict[int, int] = Field(default_factory=dict)
    host_bytes: int = 0
    prompt_cache_bytes: int = Field(
        default=0,
        description="llama.cpp: the most the worker's host prompt cache may hold (in host memory, beside "
        "`host_bytes`; a bound it fills only as states are saved, so the on-demand budget does not reserve it)",
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def terms_gib(self) -> dict[str, float]:
        """The named terms in GiB, rounded to 0.01, for tables and JSON."""
        terms = {
            "weights": self.weights_bytes,
            "kv_cache": self.kv_cache_bytes,
            "runtime": self.runtime_bytes,
            "vision_encoder": self.vision_encoder_bytes,
            "cuda_context": self.cuda_context_bytes,
            "margin": self.margin_bytes,
        }
        return {name: round(value / GIB, 2) for name, value in terms.items()}


class Shortfall(NamedTuple):
    """A rung that does not fit: what it needs against what there is (bytes), and a sentence why."""

    needed_bytes: int
    available_bytes: int
    why: str

    @property
    def gib(self) -> float:
        return (self.needed_bytes - self.available_bytes) / GIB


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def kv_element_bytes(quant_policy: int, head_dim: int) -> float:
    """Bytes per cached K or V element in TurboMind: fp16, or int8/int4 plus an fp16 scale and zero per head."""
    if quant_policy == 8:
        return 1 + 4 / head_dim
    if quant_policy == 4:
        return 0.5 + 4 / head_dim
    return 2.0


LLAMACPP_KV_ELEMENT_BYTES = {"f16": 2.0, "q8_0": 34 / 32}
"""Bytes per cached K or V element in llama.cpp: f16, or q8_0 blocks (32 int8 values + one fp16 scale)."""


# --- TurboMind -------------------------------------------------------------------------------------------


def turbomind_kv_target_bytes(shape: ModelShape, session_len: int, sessions: int, tp: int, quant_policy: int) -> int:
    """KV cache per GPU that holds `sessions` full sessions (whole 64-token blocks, heads split over tp)."""
    kv_token = math.ceil(shape.kv_bytes_per_token(kv_element_bytes(quant_policy, shape.head_dim)) / tp)
    return math.ceil(session_len / TM_BLOCK_TOKENS) * TM_BLOCK_TOKENS * kv_token * sessions


def turbomind_runtime_bytes(shape: ModelShape, session_len: int, max_batch: int, prefill_tokens: int, tp: int) -> int:
    """Activations and workspace outside the KV cache, per GPU.

    Calibrated on the three measured outcomes in docs/hardware.md: 7B tp 1, session 4096, batch 128 needs more than
    the 469 MiB that ratio 0.8 leaves (OOM); 13B tp 2, batch 64 needs more than 500 MiB at session 4096
    (OOM) and less at 2048 (serves). Buffers scale with the tokens of one forward pass (a prefill chunk is
    at most the session, at most max_prefill_token_num) plus the batch, and the fp32 logits of the batch.
    """
    tokens = min(session_len, prefill_tokens) + max_batch
    ffn = shape.ffn_size * max(1, shape.n_experts_used)
    per_token = 2 * (12 * shape.hidden_size + 6 * ffn // tp)
    return tokens * per_token + max_batch * shape.vocab_size * 4


class TurboMindFit(NamedTuple):
    session_len: int
    max_batch_size: int
    cache_max_entry_count: float
    quant_policy: int
    sessions_in_cache: int
    estimate: MemoryEstimate


def fit_turbomind(
    source: SourceInfo,
    *,
    gpu_indices: tuple[int, ...],
    free_bytes: int,
    session_len: int,
    concurrency: int,
    quant_policy: int = 0,
    max_batch_size: int | None = None,
    cache_ratio: float | None = None,
    prefill_tokens: int | None = None,
    extra_kv: bool = False,
    vision: bool = False,
) -> TurboMindFit | Shortfall:
    """Does TurboMind serve `concurrency` sessions of `session_len` on these GPUs (tp = their number), each
    showing `free_bytes` free when the worker starts? The KV cache gets sessions x 1.10 (or, with `extra_kv`,
    up to lmdeploy's 0.8 of what is free after the weights); `cache_max_entry_count` is that KV over the
    memory TurboMind finds free after its weights, so start workers in plan order. With `vision`, the image
    encoder's activations for the largest image (`vision_activation_bytes`) are kept outside the KV cache
    beside the runtime (its weights are among the checkpoint's, loaded before the KV cache is sized)."""
    shape, tp = source.shape, len(gpu_indices)
    weights = math.ceil(source.weights_bytes / tp)
    tower = source.vision if vision else None
    encoder_act = vision_activation_bytes(tower, session_len) if tower else 0
    fixed = TM_FIXED_BYTES_TP1 if tp == 1 else TM_FIXED_BYTES_TP
    free_after = free_bytes - weights - fixed
    session_kv = turbomind_kv_target_bytes(shape, session_len, 1, tp, quant_policy)
    target = session_kv * concurrency
    prefill = prefill_tokens or TM_DEFAULT_PREFILL_TOKENS
    batch = max_batch_size or concurrency

    def runtime_for(batch: int) -> int:
        return turbomind_runtime_bytes(shape, session_len, batch, prefill, tp) + encoder_act

    runtime = runtime_for(batch)
    needed = weights + fixed + runtime + target + MARGIN_BYTES
    if needed > free_bytes:
        what = f"{concurrency} x {session_len}-token session{'s' if concurrency > 1 else ''}"
        return _over_budget(needed, free_bytes, _Terms(weights, fixed, runtime, free_after, session_kv,
                            _encoder(tower, tp, encoder_act)), target, what)  # fmt: skip
    if cache_ratio is not None:
        short = _set_ratio_short(cache_ratio, free_bytes, free_after, target, runtime)
        if short is not None:
            return short
        terms = _Terms(weights, fixed, runtime, free_after, session_kv, _encoder(tower, tp, encoder_act))
        return _tm_fit(gpu_indices, session_len, quant_policy, batch, cache_ratio, terms)
    ratio = _ratio(free_after, runtime, target, extra_kv)
    if max_batch_size is None:
        # More KV holds more full sessions: let the batch grow to them, re-fitting the runtime it needs.
        wanted = max(concurrency, min(TM_MAX_BATCH, math.floor(ratio * free_after) // session_kv))
        bigger = runtime_for(wanted)
        if free_after - bigger - MARGIN_BYTES >= target:
            sessions = math.floor(_ratio(free_after, bigger, target, extra_kv) * free_after) // session_kv
            batch = max(concurrency, min(wanted, sessions))
            runtime = runtime_for(batch)
            ratio = _ratio(free_after, runtime, target, extra_kv)
    terms = _Terms(weights, fixed, runtime, free_after, session_kv, _encoder(tower, tp, encoder_act))
    return _tm_fit(gpu_indices, session_len, quant_policy, batch, ratio, terms)


def _over_budget(needed: int, free_bytes: int, terms: _Terms, target: int, what: str) -> Shortfall:
    """Weights, context, runtime, the KV target and the margin together exceed a GPU's free memory."""
    encoder = f" (vision encoder activations {gib(terms.encoder[1])} included)" if terms.encoder[1] else ""
    return Shortfall(
        needed,
        free_bytes,
        f"needs {gib(needed)} per GPU (weights {gib(terms.weights)} + cuda_context {gib(terms.fixed)} + runtime "
        f"{gib(terms.runtime)}{encoder} + KV {gib(target)} for {what} + margin {gib(MARGIN_BYTES)}), has "
        f"{gib(free_bytes)}",
    )


def _set_ratio_short(
    cache_ratio: float, free_bytes: int, free_after: int, target: int, runtime: int
) -> Shortfall | None:
    """A configured cache_max_entry_count that leaves too little KV, or too little room beside it, or None."""
    kv = math.floor(cache_ratio * free_after)
    missing = max(target - kv, runtime + MARGIN_BYTES - (free_after - kv))
    if missing <= 0:
        return None
    return Shortfall(
        free_bytes + missing,
        free_bytes,
        f"cache_max_entry_count {cache_ratio} gives KV {gib(kv)} (needs {gib(target)}) and leaves "
        f"{gib(free_after - kv)} for runtime {gib(runtime)} + margin {gib(MARGIN_BYTES)}",
    )


def _ratio(free_after: int, runtime: int, target: int, extra_kv: bool) -> float:
    """cache_max_entry_count: the KV target plus headroom (or, with extra_kv, lmdeploy's 0.8) as a fraction
    of the memory free after the weights, never leaving less than runtime + margin outside it."""
    most = (free_after - runtime - MARGIN_BYTES) / free_after
    wanted = max(target * TM_KV_HEADROOM / free_after, TM_DEFAULT_RATIO if extra_kv else 0.0)
    ratio = math.floor(min(most, wanted) * 1000) / 1000
    if math.floor(ratio * free_after) < target:
        ratio = math.ceil(target / free_after * 1000) / 1000
    return ratio


class _Terms(NamedTuple):
    """Per-GPU bytes of one TurboMind fit (`encoder`: the parts of `weights` and `runtime` that are the image
    encoder's, shown as their own term)."""

    weights: int
    fixed: int
    runtime: int
    free_after: int
    session_kv: int
    encoder: tuple[int, int] = (0, 0)


def _encoder(tower: VisionTower | None, tp: int, activations: int) -> tuple[int, int]:
    """(weights, activations) of the image encoder per GPU, or (0, 0) without one."""
    return (0, 0) if tower is None else (math.ceil(tower.weights_bytes / tp), activations)


def _tm_fit(
    gpu_indices: tuple[int, ...], session_len: int, quant_policy: int, batch: int, ratio: float, terms: _Terms
) -> TurboMindFit:
    weights, fixed, runtime, free_after, session_kv, (encoder_weights, encoder_act) = terms
    tp = len(gpu_indices)
    kv = math.floor(ratio * free_after)
    sessions = kv // session_kv
    per_gpu = weights + fixed + runtime + kv
    return TurboMindFit(
        session_len=session_len,
        max_batch_size=batch,
        cache_max_entry_count=ratio,
        quant_policy=quant_policy,
        sessions_in_cache=sessions,
        estimate=MemoryEstimate(
            engine=EngineName.LMDEPLOY,
            weights_bytes=(weights - encoder_weights) * tp,
            kv_cache_bytes=kv * tp,
            runtime_bytes=(runtime - encoder_act) * tp,
            vision_encoder_bytes=(encoder_weights + encoder_act) * tp,
            cuda_context_bytes=fixed * tp,
            margin_bytes=MARGIN_BYTES * tp,
            gpu_bytes=dict.fromkeys(gpu_indices, per_gpu),
        ),
    )


# --- llama.cpp -------------------------------------------------------------------------------------------


def llamacpp_compute_bytes(shape: ModelShape, n_ctx_total: int, n_batch: int) -> int:
    """llama.cpp's compute buffer: one micro-batch of logits, FFN and hidden activations in fp32, plus the
    attention mask over the whole context (measured 92-155 MiB for a 7B at 4k-16k)."""
    ubatch = min(n_batch, LLAMACPP_MAX_UBATCH)
    ffn = shape.ffn_size * max(1, shape.n_experts_used)
    return ubatch * (shape.vocab_size + 2 * ffn + 4 * shape.hidden_size) * 4 + n_ctx_total * ubatch * 4


class LlamaCppFit(NamedTuple):
    n_gpu_layers: int
    layers_per_gpu: dict[int, int]
    estimate: MemoryEstimate
    n_cpu_moe: int = 0


def _layer_cache(shape: ModelShape, layer: int, element: float, tokens: int, sequences: int) -> int:
    """One layer's cache: KV for `tokens`, or a recurrent layer's fixed state for each of `sequences`."""
    per_token = shape.layer_kv_bytes_per_token(layer, element)
    if per_token == 0 and shape.recurrent_state_bytes and shape.has_cache(layer):
        return shape.recurrent_state_bytes * sequences
    return per_token * tokens


def experts_on_host(source: SourceInfo, n_cpu_moe: int) -> list[int]:
    """Per block, the routed-expert bytes that `n_cpu_moe` keeps in host memory (all for -1, the first N)."""
    experts = source.layer_expert_bytes or (0,) * source.shape.n_layers
    count = len(experts) if n_cpu_moe < 0 else min(n_cpu_moe, len(experts))
    return [size if layer < count else 0 for layer, size in enumerate(experts)]


def fit_llamacpp(
    source: SourceInfo,
    *,
    budgets: dict[int, int],
    n_ctx_total: int,
    n_batch: int,
    n_offload: int,
    kv_element_bytes: float = 2.0,
    projector_bytes: int = 0,
    n_cpu_moe: int = 0,
    sequences: int = 1,
) -> LlamaCppFit | Shortfall:
    """llama.cpp with `n_gpu_layers = n_offload`: the last `n_offload` blocks on the GPUs in `budgets`
    (index -> bytes this worker may use, margin already kept out), split in proportion to room like
    llama.cpp's layer split; `n_layers + 1` or more also moves the output head (everything offloaded);
    0 is the CPU. `kv_element_bytes` is the KV cache type's (LLAMACPP_KV_ELEMENT_BYTES). `projector_bytes`: an
    image model's projector, which the worker loads on the first GPU when any layer is offloaded, else on the
    CPU. `n_cpu_moe`: a MoE's routed experts of the first N blocks (-1: all) stay in host memory while the rest
    of those blocks is offloaded (llama.cpp's --n-cpu-moe). A hybrid model's recurrent layers hold
    `recurrent_state_bytes` for each of `sequences` instead of KV. Host memory is not checked here."""
    shape = source.shape
    n_layers = shape.n_layers
    full = n_offload > n_layers
    first = n_layers - min(n_offload, n_layers)
    kv_layer = [_layer_cache(shape, layer, kv_element_bytes, n_ctx_total, sequences) for layer in range(n_layers)]
    kept = experts_on_host(source, n_cpu_moe)
    need = [source.layer_bytes[layer] - kept[layer] + kv_layer[layer] for layer in range(n_layers)]
    compute = llamacpp_compute_bytes(shape, n_ctx_total, n_batch)
    # With every layer offloaded the output head goes too; a tied head is a copy of the embedding there.
    output = source.output_bytes + (source.embedding_bytes if source.tied_embeddings else 0) if full else 0
    offloaded = need[first:]
    overhead = LLAMACPP_CUDA_CONTEXT_BYTES + compute
    placed = _offload(offloaded, budgets, overhead, output, projector_bytes) if offloaded else ({}, {})
    if placed is None:
        want = sum(offloaded) + len(budgets) * overhead + output + projector_bytes
        layers = f"{'all' if full else n_offload} layers{_experts_kept(kept)}"
        return _lc_shortfall(layers, budgets, want, f"KV for {n_ctx_total} tokens and {gib(overhead)} per GPU")
    counts, per_gpu = placed
    n_gpus = len(per_gpu)
    host_compute = 0 if full else compute  # the CPU runs whatever is not offloaded
    host_weights = sum(source.layer_bytes[:first]) + source.embedding_bytes + (0 if full else source.output_bytes)
    host_weights += sum(kept[first:])  # experts kept on the host from blocks otherwise offloaded
    host_projector = 0 if offloaded else projector_bytes
    return LlamaCppFit(
        n_gpu_layers=-1 if full else n_offload,
        layers_per_gpu=counts,
        estimate=MemoryEstimate(
            engine=EngineName.LLAMACPP,
            weights_bytes=sum(source.layer_bytes[first:]) - sum(kept[first:]) + output + host_weights,
            kv_cache_bytes=sum(kv_layer),
            runtime_bytes=compute * n_gpus + host_compute,
            vision_encoder_bytes=projector_bytes,
            cuda_context_bytes=LLAMACPP_CUDA_CONTEXT_BYTES * n_gpus,
            margin_bytes=MARGIN_BYTES * n_gpus,
            gpu_bytes=per_gpu,
            host_bytes=host_weights + sum(kv_layer[:first]) + host_compute + host_projector,
        ),
        n_cpu_moe=n_cpu_moe if any(kept) else 0,
    )


def first_fit(candidates: list[int], attempt: Callable[[int], LlamaCppFit | Shortfall]) -> LlamaCppFit | Shortfall:
    """The first candidate whose `attempt` fits, or the last shortfall met; binary search, since a fit only gets
    easier along `candidates` (fewer layers offloaded, more experts on the host)."""
    lo, hi, found = 0, len(candidates) - 1, None
    last: Shortfall | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        fit = attempt(candidates[mid])
        if isinstance(fit, LlamaCppFit):
            found, hi = fit, mid - 1
        else:
            last, lo = fit, mid + 1
    if found is not None:
        return found
    assert last is not None
    return last


def _lc_shortfall(layers: str, budgets: dict[int, int], want: int, included: str) -> Shortfall:
    have = sum(budgets.values())
    on = "GPU " + ", ".join(map(str, sorted(budgets)))
    return Shortfall(
        max(want, have + 1), have, f"{layers} on {on} need {gib(want)} ({included} included), have {gib(have)}"
    )


def _experts_kept(kept: list[int]) -> str:
    layers = sum(1 for size in kept if size)
    return f" (the routed experts of {layers} of them in host memory)" if layers else ""


def _offload(
    offloaded: list[int], budgets: dict[int, int], overhead: int, output: int, projector_bytes: int
) -> tuple[dict[int, int], dict[int, int]] | None:
    """The offloaded blocks split over the GPUs (the output head on the last, the projector on the first):
    layers and bytes per GPU index, or None when they do not fit."""
    order = sorted(budgets)
    caps = [budgets[i] - overhead - (output if i == order[-1] else 0) for i in order]
    caps[0] -= projector_bytes
    split = _split_layers(offloaded, caps)
    if split is None:
        return None
    counts: dict[int, int] = {}
    per_gpu: dict[int, int] = {}
    start = 0
    for index, count in zip(order, split, strict=True):
        if count:
            counts[index] = count
            tail = output if index == order[-1] else 0
            per_gpu[index] = sum(offloaded[start : start + count]) + overhead + tail
        start += count
    if projector_bytes:  # on the first GPU (with its context and buffers, should no layer land there)
        per_gpu[order[0]] = per_gpu.get(order[0], overhead) + projector_bytes
    return counts, per_gpu


def _split_layers(layers: list[int], caps: list[int]) -> list[int] | None:
    """Contiguous layer counts per GPU, proportional to each GPU's room; greedy fill if that fails."""
    if any(c <= 0 for c in caps) and len(caps) > 1:
        return None
    room = sum(max(c, 0) for c in caps)
    if room <= 0:
        return None
    total = sum(layers)
    bounds, acc = [], 0
    for cap in caps:
        acc += max(cap, 0)
        bounds.append(acc / room * total)
    counts, used, gpu = [0] * len(caps), [0] * len(caps), 0
    cumulative = 0
    for size in layers:
        middle = cumulative + size / 2
        while gpu < len(caps) - 1 and middle > bounds[gpu]:
            gpu += 1
        counts[gpu] += 1
        used[gpu] += size
        cumulative += size
    if all(u <= c for u, c in zip(used, caps, strict=True)):
        return counts
    counts, gpu, used_now = [0] * len(caps), 0, 0
    for size in layers:
        while gpu < len(caps) and used_now + size > caps[gpu]:
            gpu, used_now = gpu + 1, 0
        if gpu == len(caps):
            return None
        counts[gpu] += 1
        used_now += size
    return counts
