"""A random-weight Qwen3-MoE checkpoint (Hugging Face layout) for TurboMind's sizing of a MoE family (issue 39).

Qwen3-30B-A3B's blocks (`Qwen3MoeForCausalLM`: hidden 2048, 32 query / 4 KV heads of 128 with QK norms, 128
routed experts of width 768, 8 active, no shared expert), `--layers` of its 48 (default 16: ~20 GB FP16, which
a V100-32GB holds with room for KV), the 7B model's 32,000-piece SentencePiece tokenizer (written by
`.gpu/make_model.py`, so the embedding and head are smaller than Qwen's 151,936). Weights are a repeated tile
of random FP16 values (std 0.02; norms 1): speed and memory depend on shapes, not values. The safetensors files
are written directly (8-byte header length, JSON header, data), one per block group. `--sparse` writes the
headers with no data
(sparse files) and no tokenizer: enough for `voltgate plan`, which reads config.json and the headers only.

    python3 -m bench.gpu.make_moe_hf OUT_DIR [--layers 16] [--sparse]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu.tm_reasoning import add_think_tokens

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, ACTIVE, EXPERT_WIDTH, VOCAB = 128, 8, 768, 32000
LAYERS_PER_FILE = 4


def config(layers: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": 6144, "moe_intermediate_size": EXPERT_WIDTH,
        "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "num_experts": EXPERTS, "num_experts_per_tok": ACTIVE, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
        "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False, "use_sliding_window": False,
    }  # fmt: skip


def block_tensors(i: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{i}."
    yield p + "input_layernorm.weight", (HIDDEN,)
    yield p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)
    yield p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
    yield p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
    yield p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)
    yield p + "self_attn.q_norm.weight", (HEAD_DIM,)
    yield p + "self_attn.k_norm.weight", (HEAD_DIM,)
    yield p + "post_attention_layernorm.weight", (HIDDEN,)
    yield p + "mlp.gate.weight", (EXPERTS, HIDDEN)
    for e in range(EXPERTS):
        yield p + f"mlp.experts.{e}.gate_proj.weight", (EXPERT_WIDTH, HIDDEN)
        yield p + f"mlp.experts.{e}.up_proj.weight", (EXPERT_WIDTH, HIDDEN)
        yield p + f"mlp.experts.{e}.down_proj.weight", (HIDDEN, EXPERT_WIDTH)


def files(layers: int) -> Iterator[list[tuple[str, tuple[int, ...]]]]:
    """The tensors of each safetensors file: the embedding, groups of blocks, the final norm and head."""
    yield [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for start in range(0, layers, LAYERS_PER_FILE):
        yield [t for i in range(start, min(start + LAYERS_PER_FILE, layers)) for t in block_tensors(i)]
    yield [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def values(name: str, shape: tuple[int, ...], tile: np.ndarray[Any, Any]) -> bytes:
    """Norms 1, everything else a repeated tile of random values (std 0.02): drawing 10 G values would take
    minutes of a device call; the speed and memory depend on shapes only."""
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float16).tobytes()
    return np.resize(tile, shape).tobytes()


def write_file(path: Path, tensors: list[tuple[str, tuple[int, ...]]], tile: np.ndarray[Any, Any] | None) -> int:
    """One safetensors file; without `tile` its data is a hole (a sparse file of the right size)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        if tile is None:
            f.truncate(8 + len(text) + offset)
        else:
            for name, shape in tensors:
                f.write(values(name, shape, tile))
    return offset


def write_tokenizer(out: Path) -> None:
    """`.gpu/make_model.py`'s synthetic SentencePiece tokenizer (the one the 7B model has), with `<think>` and
    `</think>` as tokens."""
    spec = importlib.util.spec_from_file_location("make_model", Path(".gpu/make_model.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_tokenizer(str(out), VOCAB)
    add_think_tokens(out, out)  # a Qwen3 family: the plan starts LMDeploy's `default` reasoning parser (needs them)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--sparse", action="store_true", help="headers only, no data, no tokenizer")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config(args.layers), indent=1) + "\n")
    (args.out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    groups = list(files(args.layers))
    weight_map: dict[str, str] = {}
    total = 0
    tile = None if args.sparse else (np.random.default_rng(0).standard_normal(1 << 22) * 0.02).astype(np.float16)
    for k, tensors in enumerate(groups):
        name = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        total += write_file(args.out / name, tensors, tile)
        weight_map.update(dict.fromkeys((t for t, _ in tensors), name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (args.out / "model.safetensors.index.json").write_text(json.dumps(index) + "\n")
    if not args.sparse:
        write_tokenizer(args.out)
    print(f"{args.out}: Qwen3-MoE, {args.layers} blocks, {total / 2 / 1e9:.3f} B params, {total / 1e9:.2f} GB fp16")


if __name__ == "__main__":
    main()
