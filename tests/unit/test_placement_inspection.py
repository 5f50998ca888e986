"""Inspection reads shapes and exact tensor bytes from headers only (config.json, safetensors, GGUF)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.config import GGUFSource, HFSource
from gateway.placement import InspectionError, inspect_source
from gateway.placement.inspection import inspect_gguf, inspect_hf_dir
from tests.unit.placement_models import (
    AWQ_GEMM,
    LLAMA2_7B,
    LLAMA2_13B,
    MIXTRAL_8X7B,
    QWEN2_0_5B,
    write_gguf,
    write_hf_model,
    write_safetensors,
)

MIB = 1 << 20
LLAMA2_7B_PARAMS = 6_738_415_616  # Llama-2-7b-hf, as published
LLAMA2_13B_PARAMS = 13_015_864_320


def test_hf_fp16_sizes_come_from_safetensors_headers(tmp_path: Path) -> None:
    info = inspect_hf_dir(write_hf_model(tmp_path / "m", LLAMA2_7B))
    assert info.format == "hf" and info.torch_dtype == "float16"
    assert info.n_params == LLAMA2_7B_PARAMS
    assert info.weights_bytes == 2 * LLAMA2_7B_PARAMS  # 12,853 MiB; docs/hardware.md: 12,856 measured on the card
    assert info.shape.n_layers == 32 and info.shape.n_kv_heads == 32 and info.shape.head_dim == 128
    assert info.shape.kv_bytes_per_token() == 512 * 1024  # docs/hardware.md: 512 KiB/token
    assert len(info.layer_bytes) == 32 and len(set(info.layer_bytes)) == 1
    assert info.embedding_bytes == 32000 * 4096 * 2
    assert sum(info.layer_bytes) + info.embedding_bytes + info.output_bytes == info.weights_bytes


def test_sparse_files_prove_no_weights_are_read(tmp_path: Path) -> None:
    directory = write_hf_model(tmp_path / "m", LLAMA2_13B, shards=3)
    on_disk = sum(f.stat().st_blocks * 512 for f in directory.iterdir())
    assert on_disk < 1 * MIB
    info = inspect_hf_dir(directory)
    assert info.n_params == LLAMA2_13B_PARAMS
    assert info.file_bytes > 26 * 10**9


def test_sharded_index_with_a_missing_shard_is_an_error(tmp_path: Path) -> None:
    directory = write_hf_model(tmp_path / "m", LLAMA2_7B, shards=2)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InspectionError, match=r"missing: model-00002-of-00002\.safetensors"):
        inspect_hf_dir(directory)


def test_bf16_checkpoint_is_counted_as_float16_and_reported(tmp_path: Path) -> None:
    info = inspect_hf_dir(write_hf_model(tmp_path / "m", LLAMA2_7B, dtype="BF16"))
    assert info.torch_dtype == "bfloat16"
    assert info.weights_bytes == 2 * LLAMA2_7B_PARAMS


def test_awq_checkpoint(tmp_path: Path) -> None:
    info = inspect_hf_dir(write_hf_model(tmp_path / "m", MIXTRAL_8X7B, quant=AWQ_GEMM, shards=5), "awq")
    assert info.format == "awq" and info.quant == "awq"
    assert info.quant_config is not None and info.quant_config.bits == 4 and info.quant_config.group_size == 128
    assert info.shape.n_experts == 8 and info.shape.n_experts_used == 2 and info.shape.n_kv_heads == 8
    assert 24.5e9 < info.weights_bytes < 24.8e9  # TheBloke/Mixtral-8x7B-v0.1-AWQ is 24.65 GB
    assert 4.0 < info.bits_per_weight < 4.3


def test_an_hf_moe_counts_each_blocks_routed_experts_and_a_dense_model_none(tmp_path: Path) -> None:
    info = inspect_hf_dir(write_hf_model(tmp_path / "moe", MIXTRAL_8X7B, shards=3))
    per_block = 8 * 3 * 14336 * 4096 * 2  # 8 experts x (w1, w2, w3) in FP16; the router is not an expert
    assert info.layer_expert_bytes == (per_block,) * 32
    assert all(layer > experts for layer, experts in zip(info.layer_bytes, info.layer_expert_bytes, strict=True))
    assert inspect_hf_dir(write_hf_model(tmp_path / "dense", LLAMA2_7B)).layer_expert_bytes == ()


def test_a_shared_expert_is_not_a_routed_one(tmp_path: Path) -> None:
    """Qwen2-MoE's blocks hold a shared expert (`mlp.shared_expert.*`, read by every token) beside the routed
    ones (`mlp.experts.N.*`): only the routed count as experts a token may skip."""
    config = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 64,
              "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 100,
              "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    p = "model.layers.0.mlp"
    tensors = [(f"{p}.experts.{e}.{w}_proj.weight", "F16", (32, 64)) for e in range(4) for w in ("gate", "up", "down")]
    tensors += [(f"{p}.shared_expert.{w}_proj.weight", "F16", (128, 64)) for w in ("gate", "up", "down")]
    tensors += [(f"{p}.gate.weight", "F16", (4, 64)), (f"{p}.shared_expert_gate.weight", "F16", (1, 64))]
    write_safetensors(tmp_path / "model.safetensors", [*tensors, ("model.embed_tokens.weight", "F16", (100, 64))])
    info = inspect_hf_dir(tmp_path)
    assert info.layer_expert_bytes == (4 * 3 * 32 * 64 * 2,)
    assert info.layer_bytes == (4 * 3 * 32 * 64 * 2 + 3 * 128 * 64 * 2 + 4 * 64 * 2 + 64 * 2,)


def test_awq_declared_as_hf_is_treated_as_awq_with_a_warning(tmp_path: Path) -> None:
    info = inspect_hf_dir(write_hf_model(tmp_path / "m", MIXTRAL_8X7B, quant=AWQ_GEMM), "hf")
    assert info.format == "awq"
    assert any("treated as awq" in w for w in info.warnings)


def test_awq_declared_without_quantization_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InspectionError, match="no awq quantization_config"):
        inspect_hf_dir(write_hf_model(tmp_path / "m", LLAMA2_7B), "awq")


@pytest.mark.parametrize(
    ("quant", "mib", "bits"),
    # docs/hardware.md's measured file sizes for the Llama-2-7B shape: F16 12,853, Q8_0 6,829, Q4_K_M 3,891 MiB
    [("F16", 12_853, 16.0), ("Q8_0", 6_829, 8.5), ("Q4_K_M", 3_891, 4.84)],
)
def test_gguf_sizes_match_real_files(tmp_path: Path, quant: str, mib: int, bits: float) -> None:
    info = inspect_gguf(write_gguf(tmp_path / f"m.{quant}.gguf", LLAMA2_7B, quant))
    assert info.format == "gguf" and info.quant == quant
    assert round(info.weights_bytes / MIB) == mib
    assert info.bits_per_weight == pytest.approx(bits, abs=0.01)
    assert info.shape.architecture == "llama" and info.shape.n_layers == 32 and info.shape.max_context == 4096
    assert not info.tied_embeddings


def test_gguf_with_tied_embeddings(tmp_path: Path) -> None:
    info = inspect_gguf(write_gguf(tmp_path / "q.gguf", QWEN2_0_5B, "Q8_0"))
    assert info.tied_embeddings
    assert info.shape.n_kv_heads == 2 and info.shape.head_dim == 64 and info.shape.vocab_size == 151936


def test_split_gguf_is_named_by_its_first_part_and_needs_every_part(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m-00002-of-00002.gguf", LLAMA2_7B, "Q4_K_M")
    with pytest.raises(InspectionError, match="first split"):
        inspect_gguf(tmp_path / "m-00002-of-00002.gguf")
    write_gguf(tmp_path / "n-00001-of-00002.gguf", LLAMA2_7B, "Q4_K_M")
    with pytest.raises(InspectionError, match=r"missing: n-00002-of-00002\.gguf"):
        inspect_gguf(tmp_path / "n-00001-of-00002.gguf")


def test_not_a_gguf_is_an_inspection_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(InspectionError, match="unreadable GGUF"):
        inspect_gguf(bad)


def test_corrupt_safetensors_is_an_inspection_error(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(LLAMA2_7B))
    (directory / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    with pytest.raises(InspectionError, match="unreadable safetensors header"):
        inspect_hf_dir(directory)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (HFSource(hf="/models/absent"), "source not found: /models/absent"),
        (GGUFSource(gguf="absent.gguf"), "source not found: .*absent.gguf"),
        (GGUFSource(gguf="package:no_such_package_here/x.gguf"), "not installed"),
    ],
)
def test_missing_sources_say_so(tmp_path: Path, source: HFSource | GGUFSource, message: str) -> None:
    with pytest.raises(InspectionError, match=message):
        inspect_source(source, tmp_path)


def test_hf_dir_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InspectionError, match=r"no config\.json"):
        inspect_hf_dir(tmp_path / "empty")
