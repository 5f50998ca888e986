"""Embedding and rerank models: which task a model serves, and where its pooled-output worker runs.

A model serves `generate` unless the config says `task: embed|rerank` or its GGUF header does: an encoder
architecture (BERT and its kin) or a declared pooling type is embed, pooling rank is rerank. Only the
header is read (`gguf.GGUFReader` memory-maps the file; tensor data is never touched).

An embed/rerank model always runs in our llama.cpp worker (`--task embed|rerank`) and holds no long-lived
sessions, only its weights and one forward pass of `n_batch = max(llamacpp.n_batch, context)` tokens:

    weights                  every tensor (the token embedding stays in host memory when on a GPU)
    KV cache                 decoders only: n_batch cells (cleared before every pass); encoders have none
    output buffer (host)     llama.cpp keeps every token's logits in embedding mode: n_batch x (n_vocab + n_embd) x 4 B
    compute                  one pass is one micro-batch: activations, the attention mask (and, without flash
                             attention, the scores), a decoder's logits

It is placed after the generation models, on the one GPU with the most room they left (it may share that
GPU; a TurboMind worker on it then keeps its KV cache to its target), else on the CPU, which is also where it
runs when there is no GPU or the config says `llamacpp.n_gpu_layers: 0`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from gguf import GGUFValueType

from backends.base import DeploymentPlan, EngineName
from gateway.config import ConfigError, GGUFSource, HFSource, ModelSpec
from gateway.placement.estimate import LLAMACPP_CUDA_CONTEXT_BYTES, MemoryEstimate, Shortfall, gib
from gateway.placement.inspection import InspectionError, SourceInfo, inspect_source
from gateway.placement.inventory import Inventory
from gateway.placement.rungs import HOST_MEMORY_FRACTION, Miss, Placed

Task = Literal["generate", "embed", "rerank"]
Pooling = Literal["mean", "cls", "last", "rank"]

ENCODER_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "modern-bert", "eurobert",
     "gemma-embedding"}
)  # fmt: skip
"""GGUF architectures llama.cpp runs without a KV cache (non-causal encoders): their models embed."""

_POOLINGS: dict[int, Pooling] = {1: "mean", 2: "cls", 3: "last", 4: "rank"}  # enum llama_pooling_type
_KV_ELEMENT_BYTES = 2.0  # the worker's KV cache: bf16 on the CPU, f16 on a GPU
_FLOAT_BYTES = 4


class PooledHeader(NamedTuple):
    """What a GGUF header says about pooled outputs."""

    architecture: str
    pooling: Pooling | None  # the declared `{arch}.pooling_type` (None: none declared)
    encoder: bool
    classifier: bool  # a classifier head (`cls.output`): what pooling rank scores with


def read_pooled_header(path: Path) -> PooledHeader:
    """The GGUF's architecture, declared pooling and classifier head; raise `InspectionError` if unreadable.

    `gguf.GGUFReader` builds every array element as a numpy view, which takes seconds for a 50k-token
    vocabulary on a small host; every model's task is decided before placement, so the header is scanned here
    for the two keys and the tensor names needed, with the package's type codes. Nothing past the tensor
    infos is read.
    """
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            keys, tensors = _scan_gguf(data)
    except (OSError, ValueError, struct.error) as exc:  # missing, empty, truncated, not a GGUF
        raise InspectionError(f"{path}: unreadable GGUF: {exc}") from None
    arch = str(keys.get("general.architecture", "unknown"))
    declared = keys.get(f"{arch}.pooling_type")
    pooling = _POOLINGS.get(declared) if isinstance(declared, int) else None
    return PooledHeader(arch, pooling, arch in ENCODER_ARCHITECTURES, "cls.output.weight" in tensors)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = int(GGUFValueType.STRING), int(GGUFValueType.ARRAY)


def _scan_gguf(data: mmap.mmap) -> tuple[dict[str, object], set[str]]:
    """Scalar and string KV values (arrays skipped) and tensor names of a little-endian GGUF v2/v3."""
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (big-endian or too old) is not scanned")
    at = 24

    def string(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", data, at)
        return data[at + 8 : at + 8 + n].decode("utf-8", "replace"), at + 8 + n

    def value(kind: int, at: int) -> tuple[object, int]:
        if kind == _STRING:
            return string(at)
        if kind == _ARRAY:
            item, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if item in _SCALARS:
                return None, at + count * struct.calcsize(_SCALARS[item])
            for _ in range(count):
                _, at = value(item, at)
            return None, at
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, data, at)[0], at + struct.calcsize(fmt)

    keys: dict[str, object] = {}
    for _ in range(n_kv):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", data, at)
        keys[key], at = value(kind, at + 4)
    names: set[str] = set()
    for _ in range(n_tensors):
        name, at = string(at)
        (n_dims,) = struct.unpack_from("<I", data, at)
        at += 4 + 8 * n_dims + 4 + 8  # dims, type, offset
        names.add(name)
    return keys, names


def serving_task(spec: ModelSpec, base_dir: Path) -> Task:
    """The config's `task`, else what the first readable GGUF source's header says (a `pooling` in the config
    makes it a pooled model too); `generate` when no GGUF is readable, so the generation path reports why."""
    if spec.task is not None:
        return spec.task
    if spec.pooling is not None:
        return "rerank" if spec.pooling == "rank" else "embed"
    for source in spec.sources:
        if not isinstance(source, GGUFSource):
            continue
        try:
            header = read_pooled_header(source.resolve(base_dir))
        except Exception:  # InspectionError, or a `package:` source that is not installed (ConfigError)
            continue
        if header.pooling == "rank":
            return "rerank"
        return "embed" if header.encoder or header.pooling is not None else "generate"
    return "generate"


# --- memory --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassMemory:
    """The bytes one pooled-output worker holds beyond its weights, by term."""

    n_batch: int
    kv_bytes: int
    output_bytes: int
    compute_bytes: int


def pass_memory(source: SourceInfo, *, encoder: bool, n_batch: int, flash_attn: bool = True) -> PassMemory:
    """KV cache, output buffer and compute buffer of one forward pass of `n_batch` tokens (see the module doc).

    Checked on the CPU worker with SmolLM2 Q4_1 (`--ctx 512|2048 --slots 8`, a full pass of 480 or 2,016
    tokens): peak RSS 372 and 999 MiB against 308 and 967 MiB estimated with the weights; the Python process
    itself holds about 90 MiB of that RSS. Buffers are reserved at load but touched only by a full pass.
    """
    shape = source.shape
    kv = 0 if encoder else n_batch * shape.kv_bytes_per_token(_KV_ELEMENT_BYTES)
    output = n_batch * (shape.vocab_size + shape.hidden_size) * _FLOAT_BYTES
    ffn = shape.ffn_size * max(1, shape.n_experts_used)
    compute = n_batch * (2 * ffn + 4 * shape.hidden_size) * _FLOAT_BYTES + n_batch * n_batch * _FLOAT_BYTES
    if not flash_attn:
        compute += n_batch * n_batch * shape.n_heads * _FLOAT_BYTES
    if not encoder:  # a decoder's graph computes the output head's logits for every token too
        compute += n_batch * shape.vocab_size * _FLOAT_BYTES
    return PassMemory(n_batch, kv, output, compute)


def _gpu_weights(source: SourceInfo, encoder: bool) -> int:
    """Weights a GPU holds with every layer offloaded: the blocks and the rest, a tied decoder head's copy of
    the embedding; the token embedding itself stays in host memory."""
    tied = source.embedding_bytes if source.tied_embeddings and not encoder else 0
    return sum(source.layer_bytes) + source.output_bytes + tied


def estimate_gpu(source: SourceInfo, memory: PassMemory, encoder: bool, index: int) -> MemoryEstimate:
    weights = _gpu_weights(source, encoder)
    on_gpu = weights + memory.kv_bytes + memory.compute_bytes + LLAMACPP_CUDA_CONTEXT_BYTES
    return MemoryEstimate(
        engine=EngineName.LLAMACPP,
        weights_bytes=weights + source.embedding_bytes,
        kv_cache_bytes=memory.kv_bytes,
        runtime_bytes=memory.compute_bytes + memory.output_bytes,
        cuda_context_bytes=LLAMACPP_CUDA_CONTEXT_BYTES,
        gpu_bytes={index: on_gpu},
        host_bytes=source.embedding_bytes + memory.output_bytes,
    )


def estimate_cpu(source: SourceInfo, memory: PassMemory) -> MemoryEstimate:
    runtime = memory.compute_bytes + memory.output_bytes
    return MemoryEstimate(
        engine=EngineName.LLAMACPP,
        weights_bytes=source.weights_bytes,
        kv_cache_bytes=memory.kv_bytes,
        runtime_bytes=runtime,
        host_bytes=source.weights_bytes + memory.kv_bytes + runtime,
    )


# --- placement -----------------------------------------------------------------------------------------


@dataclass
class PooledOutcome:
    """Where an embed/rerank model runs (`placed`), or why nowhere (`refusal`), with every option passed over."""

    placed: Placed | None = None
    refusal: str | None = None
    misses: list[Miss] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def place_pooled(
    spec: ModelSpec, task: Task, base_dir: Path, inventory: Inventory, ledger: dict[int, int]
) -> PooledOutcome:
    """Place an embed/rerank model on what is left: `ledger` is each GPU's bytes still free (margin kept out).

    The highest-bit GGUF source that fits anywhere; for it, the GPU with the most room, else the CPU.
    The ledger is not changed (the caller books the plan's `gpu_bytes`).
    """
    assert task != "generate"
    out = PooledOutcome()
    sources: list[tuple[SourceInfo, PooledHeader]] = []
    problems: list[str] = []
    for source in spec.sources:
        if not isinstance(source, GGUFSource):
            where = source.hf if isinstance(source, HFSource) else "a remote endpoint"
            out.misses.append(Miss("source", f"{where}: {task} models run on llama.cpp, which reads GGUF files"))
            continue
        try:
            header = read_pooled_header(_resolve(source, base_dir))
            problem = _pooling_problem(spec, task, header)  # before the (slower) full inspection
            if problem is not None:
                problems.append(problem)
                continue
            sources.append((inspect_source(source, base_dir), header))
        except InspectionError as exc:
            out.misses.append(Miss("source", f"{source.gguf}: {exc}"))
    if spec.quant is not None:
        wanted = spec.quant.lower()
        sources = [s for s in sources if (s[0].quant or "").lower() == wanted]
        out.misses.append(Miss("override", f"quant: {spec.quant} in the config: only that source is considered"))
    if not sources:
        out.refusal = problems[0] if problems else "no usable GGUF source: " + "; ".join(m.reason for m in out.misses)
        return out
    sources.sort(key=lambda s: -s[0].bits_per_weight)
    for info, header in sources:
        placed = _place_source(spec, task, info, header, inventory, ledger, out.misses)
        if placed is not None:
            out.placed = placed
            return out
    sized = [m for m in out.misses if m.shortfall is not None]
    closest = min(sized, key=lambda m: m.shortfall.gib if m.shortfall else 0.0) if sized else None
    if closest is not None and closest.shortfall is not None:
        short = f"{closest.shortfall.gib:.1f} GiB"
        out.refusal = f"fits nowhere: short by {short} on the closest option, {closest.rung} ({closest.reason})"
    else:
        out.refusal = "no option applies: " + "; ".join(f"{m.rung}: {m.reason}" for m in out.misses)
    return out


def _resolve(source: GGUFSource, base_dir: Path) -> Path:
    try:
        path = source.resolve(base_dir)
    except ConfigError as exc:  # a `package:` source whose package is not installed
        raise InspectionError(str(exc)) from None
    if not path.exists():
        raise InspectionError(f"source not found: {path}")
    return path


def _pooling_problem(spec: ModelSpec, task: Task, header: PooledHeader) -> str | None:
    """Why the worker could not pool this GGUF as configured (it would fail at load), or None."""
    if task == "rerank":
        if header.pooling not in (None, "rank") or not header.classifier:
            return (
                f"task rerank needs a reranker GGUF (pooling rank and a classifier head `cls.output`); this "
                f"{header.architecture} GGUF declares {header.pooling or 'no'} pooling"
                + ("" if header.classifier else " and has no classifier head")
            )
        return None
    pooling = spec.pooling or header.pooling
    if pooling is None:
        return (
            f"task embed: this {header.architecture} GGUF declares no pooling type, so llama.cpp gives no vector per "
            "input; set pooling: mean (or last, which suits decoder embedding models) in the config"
        )
    if pooling == "rank":
        return "this GGUF pools by rank (a reranker): set task: rerank"
    return None


def _place_source(
    spec: ModelSpec,
    task: Task,
    info: SourceInfo,
    header: PooledHeader,
    inventory: Inventory,
    ledger: dict[int, int],
    misses: list[Miss],
) -> Placed | None:
    trained = info.shape.max_context
    context = min(spec.context, trained) if trained else spec.context
    n_batch = max(spec.llamacpp.n_batch, context)
    memory = pass_memory(info, encoder=header.encoder, n_batch=n_batch, flash_attn=spec.llamacpp.flash_attn)
    notes = [_shape_note(spec, task, header, context, memory)]
    if context < spec.context:
        notes.append(f"context {spec.context} capped at the {trained} tokens the model was trained on")
    notes.append(
        f"output buffer {gib(memory.output_bytes)} in host memory: llama.cpp keeps logits for every token of a "
        f"pass ({n_batch} x {info.shape.vocab_size} x 4 B); a shorter `context` shrinks it"
    )
    gpu_rung, cpu_rung = f"llamacpp-{task}-gpu", f"llamacpp-{task}-cpu"
    forced = spec.llamacpp.n_gpu_layers
    gpus = [g.index for g in inventory.gpus if spec.gpus is None or g.index in spec.gpus]
    if forced == 0:
        misses.append(Miss(gpu_rung, "n_gpu_layers: 0 in the config"))
    elif not gpus:
        why = f" ({inventory.note})" if inventory.note else ""
        misses.append(Miss(gpu_rung, f"no GPUs in the inventory{why}"))
    else:
        index = max(gpus, key=lambda i: (ledger[i], -i))
        estimate = estimate_gpu(info, memory, header.encoder, index)
        need = estimate.gpu_bytes[index]
        if need <= ledger[index]:
            where = f"on GPU {index}, the one with the most room left by the models placed before it"
            notes.append(f"{where}: {gib(need)} of its {gib(ledger[index])} (it may share the GPU)")
            plan = _plan(spec, task, info, context, (index,), -1)
            return Placed(gpu_rung, plan, estimate, info, tuple(notes), capacity=spec.embed_batch)
        why = f"{info.quant}: needs {gib(need)} on GPU {index} (the most room left), has {gib(ledger[index])}"
        misses.append(Miss(gpu_rung, why, Shortfall(need, ledger[index], why)))
    if forced not in (None, 0):
        misses.append(Miss(cpu_rung, f"n_gpu_layers: {forced} in the config"))
        return None
    if spec.gpus is not None:
        misses.append(Miss(cpu_rung, f"gpus: {list(spec.gpus)} in the config"))
        return None
    estimate = estimate_cpu(info, memory)
    host = inventory.host_memory_bytes
    if host is not None and estimate.host_bytes > host * HOST_MEMORY_FRACTION:
        have = int(host * HOST_MEMORY_FRACTION)
        why = f"{info.quant}: needs {gib(estimate.host_bytes)} of host memory, {gib(have)} usable"
        misses.append(Miss(cpu_rung, why, Shortfall(estimate.host_bytes, have, why)))
        return None
    notes.append(f"on the CPU: {gib(estimate.host_bytes)} of host memory (weights are memory-mapped)")
    plan = _plan(spec, task, info, context, (), 0)
    return Placed(cpu_rung, plan, estimate, info, tuple(notes), capacity=spec.embed_batch)


def _shape_note(spec: ModelSpec, task: Task, header: PooledHeader, context: int, memory: PassMemory) -> str:
    if task == "rerank":
        pooling = "rank pooling (the classifier head scores each query-document pair)"
    else:
        pooling = f"{spec.pooling} pooling (config)" if spec.pooling else f"{header.pooling} pooling (from the GGUF)"
    kind = (
        f"an encoder ({header.architecture}): no KV cache"
        if header.encoder
        else f"a decoder ({header.architecture}): KV cache {gib(memory.kv_bytes)} for one pass"
    )
    return (
        f"{task} model on llama.cpp's pooled-output worker, {pooling}; {kind}; inputs of up to {context} tokens, "
        f"up to {spec.embed_batch} per forward pass of at most {memory.n_batch} tokens"
    )


def _plan(
    spec: ModelSpec, task: Task, info: SourceInfo, context: int, gpus: tuple[int, ...], n_gpu_layers: int
) -> DeploymentPlan:
    return DeploymentPlan(
        model=spec.name,
        engine=EngineName.LLAMACPP,
        source_path=info.path,
        model_format="gguf",
        quant=info.quant,
        dtype="auto",
        gpu_indices=gpus,
        context_tokens=context,
        slots=spec.embed_batch,
        n_gpu_layers=n_gpu_layers,
        llamacpp=spec.llamacpp,
        lmdeploy=spec.lmdeploy,
        task=task,
        pooling=spec.pooling,
        matryoshka=spec.matryoshka,
        embed_truncate=spec.embed_truncate,
    )
