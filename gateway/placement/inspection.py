"""Model inspection without loading weights: config.json + safetensors headers, or GGUF metadata + tensor infos."""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from backends.base import ModelFormat
from gateway.config import ConfigError, GGUFSource, HFSource, ModelSource, RemoteSource
from gateway.placement.tallies import HFTally, tally_gguf
from gateway.placement.vision import VisionTower, vision_tower

"""A vision-language checkpoint's image encoder and projector: Qwen2-VL's `visual.*` (`model.visual.*` in
transformers 5's layout), InternVL's `vision_model.*` + `mlp1.*`, transformers' `vision_tower.*` +
`multi_modal_projector.*`."""
_GGUF_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<n>\d{5})-of-(?P<total>\d{5})\.gguf$")
_FLOAT_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_RAW_DTYPES = {"I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1}
_RAW_DTYPES.update({"F8_E4M3": 1, "F8_E5M2": 1})


class InspectionError(Exception):
    """A model source is missing, unreadable or not a model this planner understands."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelShape(_Frozen):
    """The architecture facts that memory estimates depend on."""

    architecture: str = Field(description="HF architectures[0] (LlamaForCausalLM) or GGUF general.architecture")
    n_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    n_heads: int = Field(ge=1)
    n_kv_heads: int = Field(ge=1, description="the largest per-layer value when layers differ")
    head_dim: int = Field(ge=1, description="per-head size of K")
    v_head_dim: int = Field(ge=1, description="per-head size of V")
    ffn_size: int = Field(ge=0, description="feed-forward width (per expert for MoE)")
    vocab_size: int = Field(ge=0)
    max_context: int | None = Field(default=None, description="trained context length")
    n_experts: int = 0
    n_experts_used: int = 0
    kv_heads_per_layer: tuple[int, ...] | None = None
    recurrent_state_bytes: int = Field(
        default=0,
        description="a hybrid model (Qwen3-Next, Granite-H): one sequence's fixed recurrent state in "
        "each layer without a KV cache (those layers have 0 KV heads), f32 as llama.cpp keeps it",
    )

    mtp_layers: int = Field(
        default=0,
        ge=0,
        description="trailing multi-token-prediction blocks (GGUF `nextn_predict_layers`, counted in n_layers): "
        "weights in the file, but llama.cpp keeps no KV cache or state for them",
    )

    @property
    def recurrent_layers(self) -> int:
        """Layers that keep a recurrent state instead of a KV cache."""
        if not self.recurrent_state_bytes:
            return 0
        return sum(1 for layer in range(self.n_layers) if self.has_cache(layer) and self._kv_heads(layer) == 0)

    def has_cache(self, layer: int) -> bool:
        """Whether llama.cpp keeps a KV cache or a recurrent state for this block (not for an MTP block)."""
        return layer < self.n_layers - self.mtp_layers

    def _kv_heads(self, layer: int) -> int:
        return self.kv_heads_per_layer[layer] if self.kv_heads_per_layer else self.n_kv_heads

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> int:
        """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x bytes (Llama-2-7B: 512 KiB)."""
        heads = sum(self._kv_heads(layer) for layer in range(self.n_layers) if self.has_cache(layer))
        return round(heads * (self.head_dim + self.v_head_dim) * bytes_per_element)

    def layer_kv_bytes_per_token(self, layer: int, bytes_per_element: float = 2.0) -> int:
        heads = self._kv_heads(layer) if self.has_cache(layer) else 0
        return round(heads * (self.head_dim + self.v_head_dim) * bytes_per_element)


class QuantConfig(_Frozen):
    """An HF checkpoint's `quantization_config` (AWQ or GPTQ)."""

    method: str
    bits: int | None = None
    group_size: int | None = None
    version: str | None = None
    sym: bool | None = None
    desc_act: bool | None = None


class SourceInfo(_Frozen):
    """What one model source holds, read from headers only; byte counts are as an engine loads them."""

    path: Path
    format: ModelFormat
    shape: ModelShape
    weights_bytes: int = Field(description="all tensors; float HF tensors counted as float16")
    layer_bytes: tuple[int, ...] = Field(description="per transformer block")
    layer_expert_bytes: tuple[int, ...] = Field(
        default=(),
        description="a MoE: each block's routed experts (GGUF `*_exps`, HF `.experts.`); () if none",
    )
    embedding_bytes: int = Field(description="token embedding (llama.cpp keeps it in host memory)")
    output_bytes: int = Field(description="everything else: output head, final norm")
    tied_embeddings: bool = Field(default=False, description="no output head: the embedding doubles as one")
    n_params: int
    file_bytes: int
    torch_dtype: str | None = Field(default=None, description="HF checkpoint dtype (bfloat16, float16, ...)")
    quant: str | None = Field(default=None, description="GGUF file type label (Q4_K_M) or awq/gptq")
    quant_config: QuantConfig | None = None
    vision: VisionTower | None = Field(default=None, description="the image encoder of a vision-language model")
    warnings: tuple[str, ...] = ()

    @property
    def bits_per_weight(self) -> float:
        return self.weights_bytes * 8 / max(self.n_params, 1)

    def describe(self) -> str:
        label = self.quant or self.torch_dtype or self.format
        return f"{self.path.name} ({self.format}, {label}, {self.weights_bytes / (1 << 30):.2f} GiB)"


def inspect_source(source: ModelSource, base_dir: Path) -> SourceInfo:
    """Inspect one configured source; raise `InspectionError` saying what is wrong (not found, unreadable)."""
    if isinstance(source, RemoteSource):
        raise InspectionError("a remote endpoint has no local files to inspect")
    try:
        path = source.resolve(base_dir)
    except ConfigError as exc:
        raise InspectionError(str(exc)) from None
    if isinstance(source, GGUFSource):
        return inspect_gguf(path)
    assert isinstance(source, HFSource)
    return inspect_hf_dir(path, source.format)


# --- Hugging Face directories -------------------------------------------------------------------------


def _hf_config(path: Path) -> dict[str, Any]:
    """An HF source directory's config.json, as a JSON object; a clear InspectionError otherwise."""
    if not path.exists():
        raise InspectionError(f"source not found: {path}")
    if not path.is_dir():
        raise InspectionError(f"{path}: an HF source must be a directory with config.json and *.safetensors")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InspectionError(f"{path}: no config.json") from None
    except (OSError, ValueError) as exc:
        raise InspectionError(f"{path}/config.json: unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise InspectionError(f"{path}/config.json: expected a JSON object")
    return config


def inspect_hf_dir(path: Path, declared: Literal["hf", "awq", "gptq"] = "hf") -> SourceInfo:
    """config.json for the shape, safetensors headers (all shards) for exact tensor sizes."""
    config = _hf_config(path)
    nested = config.get("text_config") or config.get("llm_config")  # InternVL's original layout: llm_config
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    shape = _hf_shape(config, text, path)
    warnings: list[str] = []
    quant_config = _quant_config(config.get("quantization_config"))
    fmt: ModelFormat = declared
    if quant_config and quant_config.method in ("awq", "gptq") and quant_config.method != declared:
        method = quant_config.method
        warnings.append(f"config.json says {method}, the source is declared {declared}: treated as {method}")
        fmt = "awq" if quant_config.method == "awq" else "gptq"
    elif declared in ("awq", "gptq") and (quant_config is None or quant_config.method != declared):
        raise InspectionError(f"{path}: declared {declared} but config.json has no {declared} quantization_config")

    tally = _tally_hf(path, shape.n_layers, quant_config)
    torch_dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "") or None
    return SourceInfo(
        path=path,
        format=fmt,
        shape=shape,
        weights_bytes=tally.weights,
        layer_bytes=tuple(tally.layers),
        layer_expert_bytes=tuple(tally.experts) if any(tally.experts) else (),
        embedding_bytes=tally.embedding,
        output_bytes=tally.other,
        n_params=tally.n_params,
        file_bytes=tally.file_bytes,
        torch_dtype=torch_dtype,
        quant=fmt if fmt in ("awq", "gptq") else None,
        quant_config=quant_config,
        vision=vision_tower(config, path, tally.vision) if isinstance(config.get("vision_config"), dict) else None,
        warnings=tuple(warnings),
    )


def _tally_hf(path: Path, n_layers: int, quant_config: QuantConfig | None) -> HFTally:
    """Every shard's tensors, from their headers."""
    tally = HFTally(layers=[0] * n_layers, experts=[0] * n_layers)
    for shard in _safetensors_files(path):
        tally.file_bytes += shard.stat().st_size
        for name, dtype, shape_ in _safetensors_header(shard):
            numel = 1
            for dim in shape_:
                numel *= dim
            if dtype in _FLOAT_DTYPES:
                nbytes = numel * 2  # engines load float checkpoints as float16
            elif dtype in _RAW_DTYPES:
                nbytes = numel * _RAW_DTYPES[dtype]
            else:
                raise InspectionError(f"{shard}: tensor {name} has unsupported dtype {dtype}")
            # packed int32 AWQ/GPTQ tensors hold 32/bits weights per element
            tally.add(
                name, nbytes, numel * (32 // (quant_config.bits or 4)) if dtype == "I32" and quant_config else numel
            )
    return tally


def _hf_shape(config: dict[str, Any], text: dict[str, Any], path: Path) -> ModelShape:
    def first(*keys: str, default: Any = None) -> Any:
        return next((text[k] for k in keys if text.get(k) is not None), default)

    try:
        n_heads = int(first("num_attention_heads", "n_head"))
        hidden = int(first("hidden_size", "n_embd", "d_model"))
        n_layers = int(first("num_hidden_layers", "n_layer", "num_layers"))
    except (TypeError, ValueError):
        needs = "num_hidden_layers, hidden_size, num_attention_heads"
        raise InspectionError(f"{path}/config.json: needs {needs}") from None
    kv_heads = first("num_key_value_heads", "num_kv_heads", default=1 if text.get("multi_query") else n_heads)
    head_dim = int(first("head_dim", default=hidden // n_heads))
    architectures = config.get("architectures") or [text.get("model_type") or "unknown"]
    return ModelShape(
        architecture=str(architectures[0]),
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=int(kv_heads),
        head_dim=head_dim,
        v_head_dim=head_dim,
        ffn_size=int(first("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)),
        vocab_size=int(first("vocab_size", default=0)),
        max_context=first("max_position_embeddings", "n_positions", "seq_length"),
        n_experts=int(first("num_local_experts", "num_experts", "n_routed_experts", default=0)),
        n_experts_used=int(first("num_experts_per_tok", default=0)),
    )


def _quant_config(raw: object) -> QuantConfig | None:
    if not isinstance(raw, dict):
        return None
    method = str(raw.get("quant_method", "")).lower()
    return QuantConfig(
        method=method,
        bits=raw.get("bits", raw.get("w_bit")),
        group_size=raw.get("group_size", raw.get("q_group_size")),
        version=str(raw["version"]).lower() if raw.get("version") is not None else None,
        sym=raw.get("sym"),
        desc_act=raw.get("desc_act"),
    )


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InspectionError(f"{index}: unreadable sharded index: {exc}") from None
        shards = [path / name for name in sorted(set(weight_map.values()))]
        missing = [s.name for s in shards if not s.is_file()]
        if missing:
            raise InspectionError(f"{index} lists shards that are missing: {', '.join(missing)}")
        return shards
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise InspectionError(f"{path}: no *.safetensors files (other weight formats are not inspected)")
    return shards


def _safetensors_header(shard: Path) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of every tensor, from the header only (the safetensors library memory-maps and
    validates the header; no tensor data is read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(shard), framework="numpy") as handle:
            out = []
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                view = handle.get_slice(name)
                out.append((name, str(view.get_dtype()), [int(d) for d in view.get_shape()]))
            return out
    except Exception as exc:  # SafetensorError and OSError: a corrupt or truncated file
        raise InspectionError(f"{shard}: unreadable safetensors header: {exc}") from None


# --- GGUF ----------------------------------------------------------------------------------------------


def inspect_gguf(path: Path) -> SourceInfo:
    """GGUF metadata and tensor infos via the `gguf` package (memory-mapped; tensor data is never read).
    A split model (`name-00001-of-00003.gguf`) is read across all its files. Reading a large vocabulary
    takes seconds, so a file already read (same path, size and mtime) is not read again."""
    if not path.exists():
        raise InspectionError(f"source not found: {path}")
    files = _gguf_files(path)
    try:
        identity = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    except OSError as exc:
        raise InspectionError(f"{path}: unreadable: {exc}") from None
    return _inspect_gguf_files(path, identity)


BF16_GGUF_WARNING = "BF16 GGUF: V100 has no BF16 arithmetic; an F16 or Q8_0 GGUF runs better"


@functools.lru_cache(maxsize=64)
def _inspect_gguf_files(path: Path, identity: tuple[tuple[str, int, int], ...]) -> SourceInfo:
    files = [Path(name) for name, _, _ in identity]
    try:
        import gguf

        readers = [gguf.GGUFReader(str(f)) for f in files]
    except Exception as exc:  # bad magic, truncated file, unknown version
        raise InspectionError(f"{path}: unreadable GGUF: {exc}") from None
    meta = readers[0]

    def field(key: str, default: Any = None) -> Any:
        f = meta.fields.get(key)
        return f.contents() if f is not None else default

    arch = str(field("general.architecture", "unknown"))
    n_layers = field(f"{arch}.block_count")
    n_heads = field(f"{arch}.attention.head_count")
    hidden = field(f"{arch}.embedding_length")
    if n_layers is None or n_heads is None or hidden is None:
        raise InspectionError(f"{path}: GGUF lacks {arch}.block_count / attention.head_count / embedding_length")
    n_heads = max(n_heads) if isinstance(n_heads, list) else int(n_heads)
    kv = field(f"{arch}.attention.head_count_kv", n_heads)
    state, kv_per_layer = _recurrent(field, arch, int(n_layers), kv)
    head_dim = int(field(f"{arch}.attention.key_length", int(hidden) // n_heads))
    ffn = field(f"{arch}.expert_feed_forward_length") or field(f"{arch}.feed_forward_length", 4 * int(hidden))
    tokens = meta.fields.get("tokenizer.ggml.tokens")
    tally = tally_gguf(readers, int(n_layers))
    label = _gguf_label(field("general.file_type"), tally.by_type)
    warnings = [BF16_GGUF_WARNING] if label == "BF16" else []
    return SourceInfo(
        path=path,
        format="gguf",
        shape=ModelShape(
            architecture=arch,
            n_layers=int(n_layers),
            hidden_size=int(hidden),
            n_heads=n_heads,
            n_kv_heads=max(kv_per_layer) if kv_per_layer else int(kv),
            head_dim=head_dim,
            v_head_dim=int(field(f"{arch}.attention.value_length", head_dim)),
            ffn_size=max(ffn) if isinstance(ffn, list) else int(ffn),
            vocab_size=int(field(f"{arch}.vocab_size", len(tokens.data) if tokens is not None else 0)),
            max_context=field(f"{arch}.context_length"),
            n_experts=int(field(f"{arch}.expert_count", 0)),
            n_experts_used=int(field(f"{arch}.expert_used_count", 0)),
            kv_heads_per_layer=kv_per_layer,
            recurrent_state_bytes=state,
            mtp_layers=int(field(f"{arch}.nextn_predict_layers", 0)),
        ),
        weights_bytes=tally.weights,
        layer_bytes=tuple(tally.layers),
        layer_expert_bytes=tuple(tally.experts) if any(tally.experts) else (),
        embedding_bytes=tally.embedding,
        output_bytes=tally.other,
        tied_embeddings=not tally.has_output,
        n_params=tally.n_params,
        file_bytes=sum(f.stat().st_size for f in files),
        quant=label,
        warnings=tuple(warnings),
    )


_RECURRENT_INTERVAL_DEFAULT = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4}
"""The families whose llama.cpp loader falls back to every 4th layer attending when the GGUF says neither
`attention.recurrent_layers` nor `full_attention_interval`."""


def _recurrent(field: Callable[..., Any], arch: str, n_layers: int, kv: Any) -> tuple[int, tuple[int, ...] | None]:
    """A GGUF's KV heads per layer (None when one value holds for all), and for a hybrid model its recurrent
    state per layer and sequence (llama.cpp's `n_embd_r + n_embd_s`, f32) with 0 KV heads for the recurrent
    layers. Which layers those are, in llama.cpp's order: the `attention.recurrent_layers` flags, else every
    `full_attention_interval`-th layer attends (Qwen3-Next), else the GGUF's own per-layer KV heads say
    (Granite-H: 0 for a Mamba2 layer). The state is 0 for a model without `ssm.state_size`."""
    kv_per_layer = tuple(int(h) for h in kv) if isinstance(kv, list) else None
    d_state = field(f"{arch}.ssm.state_size")
    if not d_state:
        return 0, kv_per_layer
    d_conv, d_inner = int(field(f"{arch}.ssm.conv_kernel", 0)), int(field(f"{arch}.ssm.inner_size", 0))
    groups = int(field(f"{arch}.ssm.group_count", 0))
    conv = max(d_conv - 1, 0) * (d_inner + 2 * groups * int(d_state))
    heads = int(max(kv) if isinstance(kv, list) else kv)
    flags = field(f"{arch}.attention.recurrent_layers")
    interval = field(f"{arch}.full_attention_interval", _RECURRENT_INTERVAL_DEFAULT.get(arch))
    if isinstance(flags, list):
        kv_per_layer = tuple(0 if i < len(flags) and flags[i] else heads for i in range(n_layers))
    elif interval:
        kv_per_layer = tuple(heads if (i + 1) % int(interval) == 0 else 0 for i in range(n_layers))
    return 4 * (conv + int(d_state) * d_inner), kv_per_layer


def _gguf_files(path: Path) -> list[Path]:
    match = _GGUF_SPLIT.match(path.name)
    if not match:
        return [path]
    if int(match.group("n")) != 1:
        raise InspectionError(f"{path}: point the source at the first split (-00001-of-{match.group('total')}.gguf)")
    total = int(match.group("total"))
    files = [path.with_name(f"{match.group('stem')}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise InspectionError(f"{path}: split GGUF files missing: {', '.join(missing)}")
    return files


def _gguf_label(file_type: object, by_type: Counter[str]) -> str:
    """`general.file_type` as llama.cpp names it (MOSTLY_Q4_K_M -> Q4_K_M); else the dominant tensor type."""
    import gguf

    if isinstance(file_type, int):
        try:
            name = gguf.LlamaFileType(file_type).name
        except ValueError:
            name = ""
        if name and name != "GUESSED":
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return by_type.most_common(1)[0][0] if by_type else "unknown"
