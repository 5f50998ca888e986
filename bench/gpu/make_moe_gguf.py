"""A random-weight mixture-of-experts GGUF of a real shape for the GPU regression's `moe-experts` pair (issue 39).

Qwen3-30B-A3B's layout (`qwen3moe`: 48 blocks, hidden 2048, 32 query / 4 KV heads of 128, 128 routed experts of
width 768, 8 active), every matrix Q4_0 (random 4-bit values, fp16 scales of 0.004: speed depends on shapes and
types, not values), norms and routers F32, ~16.6 GB. Its tokenizer is copied from another GGUF (run_regress.sh's
`moegguf` step: `.gpu/tokenizer.gguf`, the embedded SmolLM2's 49,152 tokens; its `gguf` step: the 7B's 32,000),
so the vocabulary is smaller than Qwen's 151,936: the embedding and output head are smaller, the blocks are the
real ones. One tile of random blocks is written for
every tensor of a shape, so building takes the time of writing the file. The tokenizer is copied by the tiny
fixtures' helper (`tests/fixtures/tiny_gguf.py`), so run it from the repository root.

    python3 -m bench.gpu.make_moe_gguf TOKENIZER.gguf OUT.gguf
    python3 -m bench.gpu.make_moe_gguf --tokenizer-only SOURCE.gguf OUT.gguf

`--tokenizer-only` writes a GGUF of SOURCE's `tokenizer.*` keys and no tensors (a few MB):
`prepare_regress_pack.sh` makes `.gpu/tokenizer.gguf` from the embedded SmolLM2 so that the GPU machine can
write the MoE while llama.cpp builds, without waiting for the 7B's GGUF.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.fixtures.tiny_gguf import copy_tokenizer

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 2048, 32, 4, 128, 48
EXPERTS, ACTIVE, EXPERT_WIDTH = 128, 8, 768
Q4_0_BLOCK = (18, 32)  # bytes, weights


def _q4_0(rng: np.random.Generator, *shape: int) -> np.ndarray[Any, Any]:
    """Q4_0 blocks for a (..., rows, row_length) tensor: fp16 scale 0.004 then 16 bytes of random nibbles.

    Nibbles are 1..15, weights (q - 8) x scale with mean 0. With 0..15 every weight leans -0.5 x scale and the
    lean adds up the same way in every output of a layer; that model answered with text on the CPU but with
    128 tokens of empty text through our worker on CUDA (2026-12-06): the lean is the suspect, not proven."""
    size, per = Q4_0_BLOCK
    rows = int(np.prod(shape[:-1]))
    blocks = rows * shape[-1] // per
    tile = (rng.integers(1, 16, size=(61, size)) | rng.integers(1, 16, size=(61, size)) << 4).astype(np.uint8)
    out = np.resize(tile, (blocks, size))
    out[:, 0:2] = np.full(blocks, 0.004, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
    return out.reshape(*shape[:-1], shape[-1] // per * size)


def write(tokenizer_from: Path, path: Path) -> Path:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_name("random-qwen3-30b-a3b-shape")
    for add, value in ((writer.add_context_length, 40960), (writer.add_embedding_length, HIDDEN),
                       (writer.add_block_count, LAYERS), (writer.add_feed_forward_length, 6144),
                       (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_key_length, HEAD_DIM), (writer.add_value_length, HEAD_DIM),
                       (writer.add_expert_count, EXPERTS), (writer.add_expert_used_count, ACTIVE),
                       (writer.add_expert_feed_forward_length, EXPERT_WIDTH)):  # fmt: skip
        add(value)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    n_vocab = copy_tokenizer(tokenizer_from, writer)
    q = HEADS * HEAD_DIM
    shared = {  # one array per shape, written for every tensor of that shape
        "embd": _q4_0(rng, n_vocab, HIDDEN), "q": _q4_0(rng, q, HIDDEN), "kv": _q4_0(rng, KV_HEADS * HEAD_DIM, HIDDEN),
        "o": _q4_0(rng, HIDDEN, q), "up": _q4_0(rng, EXPERTS, EXPERT_WIDTH, HIDDEN),
        "down": _q4_0(rng, EXPERTS, HIDDEN, EXPERT_WIDTH),
    }  # fmt: skip
    ones = {n: np.ones(n, dtype=np.float32) for n in (HIDDEN, HEAD_DIM)}
    router = (rng.standard_normal((EXPERTS, HIDDEN)) * 0.5).astype(np.float32)
    q40 = gguf.GGMLQuantizationType.Q4_0
    writer.add_tensor("token_embd.weight", shared["embd"], raw_dtype=q40)
    writer.add_tensor("output_norm.weight", ones[HIDDEN])
    writer.add_tensor("output.weight", shared["embd"], raw_dtype=q40)
    for i in range(LAYERS):
        b = f"blk.{i}"
        for name, key in (("attn_q", "q"), ("attn_k", "kv"), ("attn_v", "kv"), ("attn_output", "o"),
                          ("ffn_gate_exps", "up"), ("ffn_up_exps", "up"), ("ffn_down_exps", "down")):  # fmt: skip
            writer.add_tensor(f"{b}.{name}.weight", shared[key], raw_dtype=q40)
        for name, size in (("attn_norm", HIDDEN), ("ffn_norm", HIDDEN), ("attn_q_norm", HEAD_DIM),
                           ("attn_k_norm", HEAD_DIM)):  # fmt: skip
            writer.add_tensor(f"{b}.{name}.weight", ones[size])
        writer.add_tensor(f"{b}.ffn_gate_inp.weight", router)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tokenizer(source: Path, path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    copy_tokenizer(source, writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    if sys.argv[1] == "--tokenizer-only":
        print(write_tokenizer(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        print(write(Path(sys.argv[1]), Path(sys.argv[2])))
