"""The ladder's rungs: each tries one way to run a model on the memory left and returns a plan or why not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from backends.base import DeploymentPlan, EngineName, LMDeployOptions
from gateway.config import ModelSpec, PlacementSettings, mmproj_path
from gateway.placement.estimate import (
    LLAMACPP_KV_ELEMENT_BYTES,
    MARGIN_BYTES,
    LlamaCppFit,
    MemoryEstimate,
    Shortfall,
    TurboMindFit,
    first_fit,
    fit_llamacpp,
    fit_turbomind,
    gib,
    turbomind_kv_target_bytes,
)
from gateway.placement.families import turbomind_refusal
from gateway.placement.inspection import SourceInfo
from gateway.placement.inventory import GPU
from gateway.placement.tool_parsers import reasoning_parser_for, tool_parser_for
from gateway.placement.vision import TURBOMIND_VISION, vision_activation_bytes

TM_FP16 = "turbomind-fp16"
TM_MOE_UNVERIFIED = (
    "a FP16 mixture of experts on TurboMind was not loaded on a V100: LMDeploy 0.18 has a grouped FP16 GEMM for "
    "sm_70 but none for sm_90 (served as BF16 there, it matched the plan); if its worker fails to start, give the "
    "model a GGUF source and `engine: llamacpp` (docs/placement.md)"
)
TM_MOE_SM90 = (
    "a FP16 mixture of experts will not start on TurboMind here: LMDeploy 0.18 has no grouped FP16 GEMM for sm_90 "
    '(H100/H200: "no GEMM kernel family"); serve it as BF16 (`lmdeploy.extra_args: ["--dtype", "bfloat16"]`, '
    "the same memory) or from a GGUF with `engine: llamacpp` (docs/placement.md)"
)
TM_TP = "turbomind-fp16-tp"
TM_W4A16 = "turbomind-w4a16"
LC_GPU = "llamacpp-gpu"
LC_PARTIAL = "llamacpp-partial"
LC_CPU = "llamacpp-cpu"

HOST_MEMORY_FRACTION = 0.9
"""A CPU plan may use this much of host memory; beyond it the mmapped weights thrash."""


@dataclass(frozen=True)
class Placed:
    """A rung that fits: the plan, its estimate, and what a person should know about it."""

    rung: str
    plan: DeploymentPlan
    estimate: MemoryEstimate
    source: SourceInfo
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    skipped: tuple[Miss, ...] = ()
    """Options of this rung passed over on the way (a GGUF that does not fit on its own)."""
    regrow: Callable[[dict[int, int]], Placed | None] | None = field(default=None, compare=False)
    """TurboMind only: the same placement with spare memory turned into KV cache, given the budgets."""
    capacity: int = 1
    """Sessions it decodes at once as planned (TurboMind's batch, llama.cpp's slots)."""


@dataclass(frozen=True)
class Miss:
    """A rung that does not fit or is not allowed, and why (`shortfall` when memory is the reason)."""

    rung: str
    reason: str
    shortfall: Shortfall | None = None
    kv_short: float | None = None
    """TurboMind: how far the KV target exceeds the room left for KV (0.25 = 25 % more than fits)."""


@dataclass
class ModelWork:
    """One model while it is being placed: its config, its inspected sources, the GPUs it may use."""

    spec: ModelSpec
    fp16: list[SourceInfo]
    w4a16: list[SourceInfo]
    ggufs: list[SourceInfo]
    gpus: dict[int, GPU]
    host_memory_bytes: int | None
    host_threads: int = 8
    settings: PlacementSettings = field(default_factory=PlacementSettings)
    """How to choose among its fits: objective, speed metric, useful-speed floor (`Config.placement_for`)."""
    base_dir: Path = Path(".")
    """The config's folder: where a relative `mmproj` path starts."""
    _projectors: dict[Path, tuple[Path | None, int]] = field(default_factory=dict, init=False, repr=False)

    def projector(self, source: SourceInfo) -> tuple[Path | None, int]:
        """The source's multimodal projector GGUF and its size (None, 0: text only, or the file cannot be
        read); resolved once per source (a directory glob), not on every step of the offload search."""
        if source.path not in self._projectors:
            path = mmproj_path(self.spec.mmproj, source.path, self.base_dir)
            try:
                size = path.stat().st_size if path is not None else 0
            except OSError:
                size = 0
            self._projectors[source.path] = (path, size)
        return self._projectors[source.path]


# --- TurboMind -------------------------------------------------------------------------------------------


def turbomind_unsupported(source: SourceInfo, tp: int, spec: ModelSpec, policy: int | None = None) -> str | None:
    """Why TurboMind cannot run this source at this tp (and KV policy) on Volta, or None."""
    shape = source.shape
    refusal = turbomind_refusal(shape.architecture)
    if refusal is not None:
        return refusal
    if shape.head_dim not in (64, 128):
        return f"head_dim {shape.head_dim}: TurboMind on Volta needs 64 or 128"
    policy = spec.lmdeploy.quant_policy if policy is None else policy
    if policy in (4, 8) and shape.head_dim != 128:
        return f"quant_policy {policy} (KV int{policy}) needs head_dim 128, this model has {shape.head_dim}"
    if tp & (tp - 1):
        return f"tp {tp}: TurboMind needs a power of two"
    if tp > 1 and (shape.n_heads % tp or shape.n_kv_heads % tp):
        return f"tp {tp} must divide {shape.n_heads} heads and {shape.n_kv_heads} KV heads"
    quant = source.quant_config
    if source.format in ("awq", "gptq") and quant is not None:
        if quant.bits != 4 or quant.group_size != 128:
            got = f"{quant.bits} bits, group {quant.group_size}"
            return f"{source.format} with {got}: TurboMind needs 4 bits, group 128"
        if source.format == "awq" and quant.version not in (None, "gemm"):
            return f"AWQ version {quant.version}: TurboMind needs version gemm"
        if source.format == "gptq" and (quant.sym is False or quant.desc_act):
            return "GPTQ with desc_act or asymmetric quantization: TurboMind needs sym and no desc_act"
    return None


def _dtype(source: SourceInfo, gpus: list[GPU]) -> tuple[str, list[str]]:
    declared = (source.torch_dtype or "float16").lower()
    if declared == "bfloat16":
        if all(g.supports_bf16 for g in gpus):
            return "auto", []
        return "float16", [
            "bfloat16 checkpoint: Volta has no BF16, so it runs as float16; values beyond +-65504 overflow "
            "(watch for inf/NaN or garbage output)"
        ]
    if declared == "float32":
        return "float16", ["float32 checkpoint is loaded as float16"]
    return "float16", []


def _moe_warning(gpus: list[GPU], options: LMDeployOptions) -> str:
    """What the plan says of a FP16 MoE on TurboMind: it fails on sm_90 unless served as BF16; elsewhere (a V100's
    sm_70 has the kernel family) it was not loaded here."""
    bf16 = options.extra_value("--dtype") == "bfloat16"
    if not bf16 and any(g.compute_capability[0] == 9 for g in gpus):
        return TM_MOE_SM90
    return TM_MOE_UNVERIFIED


def turbomind_gpu_sets(work: ModelWork, budgets: dict[int, int], tp: int) -> list[tuple[int, ...]]:
    """tp 1: every usable GPU, tightest fit first. tp > 1: per kind of identical GPUs, the `tp` roomiest."""
    usable = [work.gpus[i] for i in budgets if work.gpus[i].compute_capability >= (7, 0)]
    if tp == 1:
        return [(g.index,) for g in sorted(usable, key=lambda g: (budgets[g.index], g.index))]
    kinds: dict[tuple[str, int, tuple[int, int]], list[GPU]] = {}
    for gpu in usable:
        kinds.setdefault(gpu.kind, []).append(gpu)
    sets = []
    for group in kinds.values():
        if len(group) >= tp:
            best = sorted(group, key=lambda g: -budgets[g.index])[:tp]
            sets.append(tuple(sorted(g.index for g in best)))
    return sets


def try_turbomind(
    work: ModelWork,
    rung: str,
    source: SourceInfo,
    budgets: dict[int, int],
    tp: int,
    session: int,
    *,
    policy: int,
    sessions: int,
    notes: tuple[str, ...] = (),
) -> Placed | Miss:
    """TurboMind for one source at one tp, session length, KV policy (0 = fp16, 8 = int8) and number of
    full sessions in the cache: the tightest set of GPUs that fits, or the closest miss."""
    problem = turbomind_unsupported(source, tp, work.spec, policy)
    if problem:
        return Miss(rung, problem)
    sets = turbomind_gpu_sets(work, budgets, tp)
    if not sets:
        return Miss(rung, f"needs {tp} identical GPUs with room (sm70+); the inventory has none such")
    closest: Shortfall | None = None
    for gpus in sets:
        fit = _fit_tm(work, source, budgets, gpus, session, policy, sessions, extra_kv=False)
        if isinstance(fit, TurboMindFit):
            return _tm_placed(work, rung, source, gpus, fit, list(notes), tp, session, sessions)
        if closest is None or fit.gib < closest.gib:
            closest = fit
    assert closest is not None
    target = turbomind_kv_target_bytes(source.shape, session, sessions, tp, policy)
    room = target - (closest.needed_bytes - closest.available_bytes)
    short = target / room - 1 if room > 0 else float("inf")
    kv = "KV int8: " if policy == 8 else "KV int4: " if policy == 4 else ""
    return Miss(rung, f"{'tp ' + str(tp) + ': ' if tp > 1 else ''}{kv}{closest.why}", closest, short)


def _fit_tm(
    work: ModelWork,
    source: SourceInfo,
    budgets: dict[int, int],
    gpus: tuple[int, ...],
    session: int,
    policy: int,
    sessions: int,
    *,
    extra_kv: bool,
) -> TurboMindFit | Shortfall:
    spec = work.spec
    return fit_turbomind(
        source,
        gpu_indices=gpus,
        free_bytes=min(budgets[i] for i in gpus) + MARGIN_BYTES,
        session_len=session,
        concurrency=sessions,
        quant_policy=policy,
        max_batch_size=spec.lmdeploy.max_batch_size,
        cache_ratio=spec.lmdeploy.cache_max_entry_count,
        prefill_tokens=spec.lmdeploy.max_prefill_token_num,
        extra_kv=extra_kv,
        vision=vision_encoder(source) is not None,
    )


def vision_encoder(source: SourceInfo) -> str | None:
    """The image encoder TurboMind runs for this checkpoint (its name), or None: a text-only deployment."""
    return TURBOMIND_VISION.get(source.shape.architecture) if source.vision is not None else None


def _vision_note(source: SourceInfo, fit: TurboMindFit) -> list[str]:
    """What the plan counts for the image encoder, in words (none for a text-only model)."""
    tower, name = source.vision, vision_encoder(source)
    if tower is None or name is None:
        return []
    activations = vision_activation_bytes(tower, fit.session_len)
    patches = min(tower.max_patches, tower.merge * fit.session_len)
    return [
        f"vision encoder ({name}, {tower.describe()}) counted on the GPU: weights {gib(tower.weights_bytes)} + "
        f"activations {gib(activations)} for the largest image ({patches} patches, {patches // tower.merge} "
        "tokens), kept outside the KV cache; images are served (vision: true)"
    ]


def _prefix_note(on: bool) -> str:
    """What prefix caching does to the KV budget, in words (docs/engines.md, "Prefix caching")."""
    if not on:
        return "prefix caching off (lmdeploy.prefix_caching: false): every prompt is prefilled in full"
    return (
        "prefix caching on: a prompt's full 64-token KV blocks stay in this KV cache after its request ends and "
        "are reused by a later prompt with the same prefix; they take no memory beyond it (evicted, oldest "
        "first, when live sessions need the blocks), so the sessions above are unchanged"
    )


def _tm_placed(
    work: ModelWork,
    rung: str,
    source: SourceInfo,
    gpus: tuple[int, ...],
    fit: TurboMindFit,
    notes: list[str],
    tp: int,
    session: int,
    sessions: int,
) -> Placed:
    spec = work.spec
    dtype, warnings = _dtype(source, [work.gpus[i] for i in gpus])
    if source.layer_expert_bytes and source.format == "hf":  # AWQ/GPTQ experts have TurboMind's int4 kernels
        warnings = [*warnings, _moe_warning([work.gpus[i] for i in gpus], spec.lmdeploy)]
    plan = DeploymentPlan(
        model=spec.name,
        engine=EngineName.LMDEPLOY,
        source_path=source.path,
        model_format=source.format,
        quant=source.quant,
        dtype="auto" if dtype == "auto" else "float16",
        gpu_indices=gpus,
        tp=tp,
        context_tokens=fit.session_len,
        slots=fit.max_batch_size,
        cache_max_entry_count=fit.cache_max_entry_count,
        quant_policy=0 if fit.quant_policy == 0 else 8 if fit.quant_policy == 8 else 4,
        max_batch_size=fit.max_batch_size,
        llamacpp=spec.llamacpp,
        lmdeploy=spec.lmdeploy,
        tool_parser=spec.lmdeploy.tool_parser or tool_parser_for(source),
        reasoning_parser=spec.lmdeploy.reasoning_parser or reasoning_parser_for(source),
        vision_encoder=vision_encoder(source),
    )
    notes = [
        *notes,
        *_vision_note(source, fit),
        f"KV cache {gib(fit.estimate.kv_cache_bytes)} holds {fit.sessions_in_cache} full {session}-token "
        f"session(s); max_batch_size {fit.max_batch_size}; cache_max_entry_count {fit.cache_max_entry_count} "
        "of the memory free after the weights",
        _prefix_note(spec.lmdeploy.prefix_caching),
    ]

    def regrow(budgets: dict[int, int]) -> Placed | None:
        more = _fit_tm(work, source, budgets, gpus, session, fit.quant_policy, sessions, extra_kv=True)
        if not isinstance(more, TurboMindFit) or more.estimate.kv_cache_bytes <= fit.estimate.kv_cache_bytes:
            return None
        return _tm_placed(
            work, rung, source, gpus, more, notes[: -1 - len(_vision_note(source, fit))], tp, session, sessions
        )

    capacity = min(fit.max_batch_size, max(fit.sessions_in_cache, sessions))
    return Placed(rung, plan, fit.estimate, source, tuple(notes), tuple(warnings), regrow=regrow, capacity=capacity)


# --- llama.cpp -------------------------------------------------------------------------------------------


def llamacpp_plan(
    work: ModelWork, source: SourceInfo, fit: LlamaCppFit, context: int, slots: int, kv: str = "f16"
) -> DeploymentPlan:
    spec = work.spec
    return DeploymentPlan(
        model=spec.name,
        engine=EngineName.LLAMACPP,
        source_path=source.path,
        model_format="gguf",
        quant=source.quant,
        dtype="auto",
        gpu_indices=tuple(sorted(fit.layers_per_gpu)),
        tp=1,
        context_tokens=context,
        slots=slots,
        n_gpu_layers=fit.n_gpu_layers,
        n_cpu_moe=fit.n_cpu_moe,
        llamacpp=spec.llamacpp,
        lmdeploy=spec.lmdeploy,
        kv_cache_type="q8_0" if kv == "q8_0" else "f16",
        mmproj=work.projector(source)[0],
    )


def layers_note(source: SourceInfo, fit: LlamaCppFit) -> str:
    where = ", ".join(f"GPU {i}: {n}" for i, n in sorted(fit.layers_per_gpu.items()))
    total = source.shape.n_layers
    if fit.n_gpu_layers == -1:
        return f"all {total} layers and the output head on the GPU ({where})" + _projector_note(fit, on_gpu=True)
    note = f"{fit.n_gpu_layers} of {total} layers on the GPU ({where}); the rest run on the CPU"
    return note + _projector_note(fit, on_gpu=True)


def _projector_note(fit: LlamaCppFit, *, on_gpu: bool) -> str:
    """The image projector's share, where the worker loads it (its compute buffer per image is not counted)."""
    size = fit.estimate.vision_encoder_bytes
    if not size:
        return ""
    where = f"GPU {min(fit.layers_per_gpu or fit.estimate.gpu_bytes)}" if on_gpu else "host memory"
    return f"; the image projector's weights ({gib(size)}) in {where}"


def try_llamacpp_gpu(
    work: ModelWork, source: SourceInfo, budgets: dict[int, int], context: int, slots: int, kv: str = "f16"
) -> Placed | Miss:
    """Every layer of one GGUF on GPUs, KV cache `kv` (f16 or q8_0): one GPU (tightest fit) before two,
    before more (or exactly the configured GPUs)."""
    by_room = sorted(budgets, key=lambda i: -budgets[i])
    sets: list[tuple[int, ...]] = [(i,) for i in sorted(budgets, key=lambda i: (budgets[i], i))]
    sets += [tuple(sorted(by_room[:n])) for n in range(2, len(by_room) + 1)]
    if work.spec.gpus is not None:  # the configured GPUs, all of them
        sets = [tuple(sorted(budgets))]
    closest: Shortfall | None = None
    for gpus in sets:
        fit = fit_lc(work, source, {i: budgets[i] for i in gpus}, context, slots, source.shape.n_layers + 1, kv)
        if isinstance(fit, LlamaCppFit):
            plan = llamacpp_plan(work, source, fit, context, slots, kv)
            notes: tuple[str, ...] = (layers_note(source, fit),)
            if kv == "q8_0":
                notes = (f"KV cache q8_0 (flash attention): {gib(fit.estimate.kv_cache_bytes)}", *notes)
            return Placed(LC_GPU, plan, fit.estimate, source, notes, capacity=slots)
        if closest is None or fit.gib < closest.gib:
            closest = fit
    assert closest is not None
    return Miss(LC_GPU, f"{source.quant}{', KV q8_0' if kv == 'q8_0' else ''}: {closest.why}", closest)


def try_llamacpp_partial(work: ModelWork, budgets: dict[int, int], context: int, slots: int) -> Placed | list[Miss]:
    """As many layers as fit on all GPUs with room; of several GGUFs the one leaving the fewest weight
    bytes on the CPU (decode speed is bounded by the CPU's share)."""
    forced = work.spec.llamacpp.n_gpu_layers
    best: tuple[int, float, Placed] | None = None
    misses: list[Miss] = []
    for source in work.ggufs:
        n_layers = source.shape.n_layers
        candidates = [min(forced, n_layers)] if forced else list(range(n_layers, 0, -1))
        fit = _largest_fit(work, source, budgets, context, slots, candidates)
        if isinstance(fit, Shortfall):
            misses.append(Miss(LC_PARTIAL, f"{source.quant}: not one layer fits: {fit.why}", fit))
            continue
        host_weights = fit.estimate.weights_bytes - sum(source.layer_bytes[n_layers - fit.n_gpu_layers :])
        placed = Placed(
            LC_PARTIAL,
            llamacpp_plan(work, source, fit, context, slots),
            fit.estimate,
            source,
            (layers_note(source, fit), f"{gib(host_weights)} of weights stay in host memory"),
            capacity=slots,
        )
        host_miss = host_check(work, placed)
        if host_miss:
            misses.append(host_miss)
            continue
        key = (host_weights, -source.bits_per_weight)
        if best is None or key < best[:2]:
            best = (host_weights, -source.bits_per_weight, placed)
    return replace(best[2], skipped=tuple(misses)) if best else misses


def _largest_fit(
    work: ModelWork, source: SourceInfo, budgets: dict[int, int], context: int, slots: int, candidates: list[int]
) -> LlamaCppFit | Shortfall:
    """The first candidate layer count (descending) that fits."""
    return first_fit(candidates, lambda n: fit_lc(work, source, budgets, context, slots, n))


def try_llamacpp_cpu(work: ModelWork, context: int, slots: int) -> Placed | list[Miss]:
    """Everything in host memory, the highest-bit GGUF that host memory holds."""
    misses: list[Miss] = []
    for source in work.ggufs:
        fit = fit_lc(work, source, {}, context, slots, 0)
        assert isinstance(fit, LlamaCppFit)
        placed = Placed(
            LC_CPU,
            llamacpp_plan(work, source, fit, context, slots),
            fit.estimate,
            source,
            (
                f"{gib(fit.estimate.host_bytes)} of host memory (weights are memory-mapped)"
                + _projector_note(fit, on_gpu=False),
            ),
            capacity=slots,
        )
        miss = host_check(work, placed)
        if miss is None:
            return replace(placed, skipped=tuple(misses))
        misses.append(miss)
    return misses


def host_check(work: ModelWork, placed: Placed) -> Miss | None:
    host = work.host_memory_bytes
    need = placed.estimate.host_bytes
    if host is None or need <= host * HOST_MEMORY_FRACTION:
        return None
    have = int(host * HOST_MEMORY_FRACTION)
    why = f"{placed.source.quant}: needs {gib(need)} of host memory, {gib(have)} usable"
    return Miss(placed.rung, why, Shortfall(need, have, why))


def fit_lc(
    work: ModelWork,
    source: SourceInfo,
    budgets: dict[int, int],
    context: int,
    slots: int,
    n_offload: int,
    kv: str = "f16",
    n_cpu_moe: int | None = None,
) -> LlamaCppFit | Shortfall:
    """`fit_llamacpp` for this model; `n_cpu_moe` None: the config's (0 unless pinned)."""
    return fit_llamacpp(
        source,
        budgets=budgets,
        n_ctx_total=context * slots,
        n_batch=work.spec.llamacpp.n_batch,
        n_offload=n_offload,
        kv_element_bytes=LLAMACPP_KV_ELEMENT_BYTES[kv],
        projector_bytes=work.projector(source)[1],
        n_cpu_moe=work.spec.llamacpp.n_cpu_moe if n_cpu_moe is None else n_cpu_moe,
        sequences=slots,
    )
