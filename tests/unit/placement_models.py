"""Header-only model files of real shapes for the placement tests.

Real config.json contents (Llama-2 7B/13B/70B, Mixtral-8x7B, Mistral-7B, Qwen2-0.5B), safetensors files
whose headers list every tensor of the real model (8-byte length + JSON) and GGUF files written with
`gguf.GGUFWriter` with every tensor info of the real model; both are sparse files truncated to their full
length, so they take no disk space and the inspection must read sizes from headers.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np

Tensor = tuple[str, str, tuple[int, ...]]  # name, safetensors dtype, shape (out, in)

LLAMA2_7B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.31.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
LLAMA2_13B = {**LLAMA2_7B, "hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40,
              "num_hidden_layers": 40, "num_key_value_heads": 40}  # fmt: skip
LLAMA2_70B = {**LLAMA2_7B, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
              "num_hidden_layers": 80, "num_key_value_heads": 8}  # fmt: skip
MISTRAL_7B: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0",
    "use_cache": True,
    "vocab_size": 32768,
}
GPT_OSS_20B: dict[str, Any] = {  # openai/gpt-oss-20b's config.json, as a BF16 checkpoint (no MXFP4 quantization_config)
    "architectures": ["GptOssForCausalLM"],
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 201088,
}
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
AWQ_GEMM = {"quant_method": "awq", "zero_point": True, "group_size": 128, "bits": 4, "version": "gemm"}
QWEN2_0_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}


def hf_tensors(config: dict[str, Any], dtype: str = "F16", awq: bool = False) -> list[Tensor]:
    """Every tensor of a Llama/Mistral/Mixtral/Qwen2 checkpoint, HF names, (out, in) shapes."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    vocab, experts = config["vocab_size"], config.get("num_local_experts", 0)

    def linear(name: str, out_f: int, in_f: int) -> list[Tensor]:
        if not awq:
            return [(f"{name}.weight", dtype, (out_f, in_f))]
        return [
            (f"{name}.qweight", "I32", (in_f, out_f // 8)),
            (f"{name}.qzeros", "I32", (in_f // 128, out_f // 8)),
            (f"{name}.scales", "F16", (in_f // 128, out_f)),
        ]

    out: list[Tensor] = [("model.embed_tokens.weight", dtype, (vocab, hidden))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += linear(f"{p}.self_attn.q_proj", hidden, hidden)
        out += linear(f"{p}.self_attn.k_proj", kv * head_dim, hidden)
        out += linear(f"{p}.self_attn.v_proj", kv * head_dim, hidden)
        out += linear(f"{p}.self_attn.o_proj", hidden, hidden)
        if config["model_type"] == "qwen2":
            out += [(f"{p}.self_attn.{n}_proj.bias", dtype, (d,)) for n, d in (("q", hidden), ("k", kv * head_dim),
                                                                                ("v", kv * head_dim))]  # fmt: skip
        if experts:
            out.append((f"{p}.block_sparse_moe.gate.weight", "F16" if awq else dtype, (experts, hidden)))
            for e in range(experts):
                q = f"{p}.block_sparse_moe.experts.{e}"
                out += linear(f"{q}.w1", inter, hidden) + linear(f"{q}.w2", hidden, inter)
                out += linear(f"{q}.w3", inter, hidden)
        else:
            out += linear(f"{p}.mlp.gate_proj", inter, hidden) + linear(f"{p}.mlp.up_proj", inter, hidden)
            out += linear(f"{p}.mlp.down_proj", hidden, inter)
        out += [
            (f"{p}.input_layernorm.weight", dtype, (hidden,)),
            (f"{p}.post_attention_layernorm.weight", dtype, (hidden,)),
        ]
    out.append(("model.norm.weight", dtype, (hidden,)))
    if not config.get("tie_word_embeddings"):
        out.append(("lm_head.weight", dtype, (vocab, hidden)))
    return out


_ST_SIZES = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4}


def write_safetensors(path: Path, tensors: list[Tensor]) -> int:
    """A safetensors file with the real header and a sparse (unwritten) data section; returns data bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        nbytes = int(np.prod(shape)) * _ST_SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.truncate(8 + len(blob) + offset)
    return offset


def write_hf_model(
    directory: Path, config: dict[str, Any], *, dtype: str = "F16", quant: dict[str, Any] | None = None, shards: int = 1
) -> Path:
    """config.json + safetensors (sharded with model.safetensors.index.json when shards > 1)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {**config, **({"quantization_config": quant} if quant else {})}
    if dtype == "BF16":
        config["torch_dtype"] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = hf_tensors(config, dtype, awq=quant is not None)
    if shards == 1:
        write_safetensors(directory / "model.safetensors", tensors)
        return directory
    per = -(-len(tensors) // shards)
    weight_map, total = {}, 0
    for n in range(shards):
        name = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        part = tensors[n * per : (n + 1) * per]
        total += write_safetensors(directory / name, part)
        weight_map.update({t[0]: name for t in part})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


QWEN3_30B_A3B: dict[str, Any] = {  # Qwen/Qwen3-30B-A3B's config.json, the fields the GGUF writer reads
    "architectures": ["Qwen3MoeForCausalLM"],
    "gguf_arch": "qwen3moe",
    "hidden_size": 2048,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "max_position_embeddings": 40960,
    "num_attention_heads": 32,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}


QWEN3_NEXT_80B_A3B: dict[str, Any] = {  # Qwen/Qwen3-Next-80B-A3B's config.json, the fields the GGUF writer reads
    **QWEN3_30B_A3B,
    "architectures": ["Qwen3NextForCausalLM"],
    "gguf_arch": "qwen3next",
    "head_dim": 256,
    "moe_intermediate_size": 512,
    "max_position_embeddings": 262144,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "full_attention_interval": 4,  # layers 3, 7, ..., 47 keep a KV cache; the other 36 a gated delta net state
    "ssm": {"conv_kernel": 4, "state_size": 128, "group_count": 16, "inner_size": 4096, "time_step_rank": 32},
}


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which layers Q4_K_M keeps at Q6_K (attn_v, ffn_down)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _gguf_tensors(config: dict[str, Any], quant: str) -> Iterator[tuple[str, tuple[int, ...], str]]:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv, n = config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]
    head_dim = config.get("head_dim", hidden // heads)
    q_dim, kv_dim, vocab = heads * head_dim, kv * head_dim, config["vocab_size"]
    base = {"F16": "F16", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}[quant]
    yield "token_embd.weight", (vocab, hidden), base
    for i in range(n):
        more = "Q6_K" if quant == "Q4_K_M" and _use_more_bits(i, n) else base
        yield f"blk.{i}.attn_norm.weight", (hidden,), "F32"
        yield f"blk.{i}.attn_q.weight", (q_dim, hidden), base
        yield f"blk.{i}.attn_k.weight", (kv_dim, hidden), base
        yield f"blk.{i}.attn_v.weight", (kv_dim, hidden), more
        yield f"blk.{i}.attn_output.weight", (hidden, q_dim), base
        yield f"blk.{i}.ffn_norm.weight", (hidden,), "F32"
        if "num_experts" in config:  # routed experts stacked per block, and the router
            experts, width = config["num_experts"], config["moe_intermediate_size"]
            yield f"blk.{i}.ffn_gate_inp.weight", (experts, hidden), "F32"
            yield f"blk.{i}.ffn_gate_exps.weight", (experts, width, hidden), base
            yield f"blk.{i}.ffn_up_exps.weight", (experts, width, hidden), base
            yield f"blk.{i}.ffn_down_exps.weight", (experts, hidden, width), more
            continue
        yield f"blk.{i}.ffn_gate.weight", (inter, hidden), base
        yield f"blk.{i}.ffn_up.weight", (inter, hidden), base
        yield f"blk.{i}.ffn_down.weight", (hidden, inter), more
    yield "output_norm.weight", (hidden,), "F32"
    if not config.get("tie_word_embeddings"):
        yield "output.weight", (vocab, hidden), "Q6_K" if quant == "Q4_K_M" else base


_FILE_TYPES = {"F16": gguf.LlamaFileType.MOSTLY_F16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
               "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M}  # fmt: skip


def write_gguf(path: Path, config: dict[str, Any], quant: str = "Q4_K_M") -> Path:
    """A GGUF of the model's real tensor infos and metadata, data section sparse."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), config.get("gguf_arch", "llama"))
    writer.add_name(path.stem)
    if "num_experts" in config:
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if "ssm" in config:  # a hybrid: which layers attend, the recurrent state's dimensions
        writer.add_full_attention_interval(config["full_attention_interval"])
        ssm = config["ssm"]
        writer.add_ssm_conv_kernel(ssm["conv_kernel"])
        writer.add_ssm_state_size(ssm["state_size"])
        writer.add_ssm_group_count(ssm["group_count"])
        writer.add_ssm_inner_size(ssm["inner_size"])
        writer.add_ssm_time_step_rank(ssm["time_step_rank"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(_FILE_TYPES[quant])
    data = 0
    for name, shape, type_name in _gguf_tensors(config, quant):
        qtype = gguf.GGMLQuantizationType[type_name]
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        byte_shape = (*shape[:-1], shape[-1] // block * type_size)
        nbytes = int(np.prod(byte_shape))
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        data += -(-nbytes // 32) * 32
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    start = -(-os.path.getsize(path) // 32) * 32
    os.truncate(path, start + data)
    return path


def build_zoo(root: Path) -> Path:
    """Every model the placement tests use, header-only, under `root` (about 0.1 s; no disk blocks)."""
    write_hf_model(root / "llama2-7b", LLAMA2_7B)
    write_hf_model(root / "llama2-7b-bf16", LLAMA2_7B, dtype="BF16")
    write_hf_model(root / "llama2-13b", LLAMA2_13B, shards=3)
    write_hf_model(root / "llama2-70b", LLAMA2_70B, shards=15)
    write_hf_model(root / "mixtral-8x7b-awq", MIXTRAL_8X7B, quant=AWQ_GEMM, shards=5)
    write_hf_model(root / "mistral-7b", MISTRAL_7B, dtype="BF16", shards=2)
    write_hf_model(root / "gpt-oss-20b-bf16", GPT_OSS_20B, dtype="BF16", shards=3)
    write_hf_model(root / "qwen2-0.5b", QWEN2_0_5B, dtype="BF16")
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        write_gguf(root / f"llama2-7b.{quant}.gguf", LLAMA2_7B, quant)
    for quant in ("Q8_0", "Q4_K_M"):
        write_gguf(root / f"llama2-70b.{quant}.gguf", LLAMA2_70B, quant)
    write_gguf(root / "qwen2-0.5b.Q8_0.gguf", QWEN2_0_5B, "Q8_0")
    write_gguf(root / "qwen3-30b-a3b.Q4_K_M.gguf", QWEN3_30B_A3B, "Q4_K_M")
    write_gguf(root / "qwen3-next-80b-a3b.Q4_K_M.gguf", QWEN3_NEXT_80B_A3B, "Q4_K_M")
    return root
