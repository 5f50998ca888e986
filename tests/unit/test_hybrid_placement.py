"""A hybrid-attention model (Qwen3-Next: one layer in four attends, the others keep a fixed recurrent state) is
sized as llama.cpp allocates it (issue 39 item 1): KV only for the attention layers, the recurrent state per
sequence for the others (llama.cpp's `n_embd_r + n_embd_s`, f32), read from the GGUF's header. The same sizes
are checked against a real llama.cpp load in tests/integration/test_hybrid_memory.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest

from gateway.placement.estimate import LlamaCppFit, fit_llamacpp
from gateway.placement.inspection import inspect_gguf
from tests.fixtures.tiny_hybrid import (
    HEAD_DIM,
    KV_HEADS_PER_LAYER,
    N_HEAD_KV,
    N_LAYER,
    STATE_FLOATS_PER_LAYER,
    write_tiny_hybrid,
)
from tests.unit.placement_models import QWEN3_NEXT_80B_A3B, build_zoo

GGUF = "qwen3-next-80b-a3b.Q4_K_M.gguf"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def test_the_attention_layers_and_the_recurrent_state_are_read(zoo: Path) -> None:
    shape = inspect_gguf(zoo / GGUF).shape
    assert shape.kv_heads_per_layer is not None
    attending = [i for i, h in enumerate(shape.kv_heads_per_layer) if h]
    assert attending == list(range(3, 48, 4)) and shape.recurrent_layers == 36
    ssm = QWEN3_NEXT_80B_A3B["ssm"]
    conv = (ssm["conv_kernel"] - 1) * (ssm["inner_size"] + 2 * ssm["group_count"] * ssm["state_size"])
    assert shape.recurrent_state_bytes == 4 * (conv + ssm["state_size"] * ssm["inner_size"])  # 2.1 MiB a layer
    # a token's KV: 12 layers x 2 heads x (256 + 256) x 2 bytes, not 48 layers' worth
    assert shape.kv_bytes_per_token() == 12 * 2 * 512 * 2


def test_the_cache_is_kv_for_tokens_plus_state_for_sequences(zoo: Path) -> None:
    info = inspect_gguf(zoo / GGUF)
    every = {0: 1 << 50}  # room for anything: only the sizes are compared
    one = fit_llamacpp(info, budgets=every, n_ctx_total=32768, n_batch=512, n_offload=99, sequences=1)
    four = fit_llamacpp(info, budgets=every, n_ctx_total=4 * 32768, n_batch=512, n_offload=99, sequences=4)
    assert isinstance(one, LlamaCppFit) and isinstance(four, LlamaCppFit)
    kv_one, kv_four = one.estimate.kv_cache_bytes, four.estimate.kv_cache_bytes
    state = info.shape.recurrent_state_bytes * 36
    assert kv_one == info.shape.kv_bytes_per_token() * 32768 + state
    assert kv_four == info.shape.kv_bytes_per_token() * 4 * 32768 + 4 * state
    dense = 48 * 2 * 512 * 2 * 32768  # what sizing every layer as attention would have said
    assert kv_one < dense / 3


def test_granite_h_attention_layers_are_read_from_the_per_layer_kv_heads(smollm2_path: Path, tmp_path: Path) -> None:
    """Granite-H says which blocks attend by `attention.head_count_kv` per layer (0: Mamba2), not by an interval;
    the tiny GGUF that tests/integration/test_hybrid_memory.py loads in llama.cpp."""
    shape = inspect_gguf(write_tiny_hybrid(smollm2_path, tmp_path / "tiny-hybrid.gguf")).shape
    assert shape.kv_heads_per_layer == KV_HEADS_PER_LAYER and shape.recurrent_layers == N_LAYER - 2
    assert shape.recurrent_state_bytes == 4 * STATE_FLOATS_PER_LAYER
    assert shape.kv_bytes_per_token() == 2 * N_HEAD_KV * 2 * HEAD_DIM * 2  # 2 attention layers, K and V, f16


def _qwen3next_header(path: Path, **keys: Any) -> Path:
    """A header-only Qwen3-Next GGUF of 8 blocks (no tensors) with the given layout keys."""
    writer = gguf.GGUFWriter(str(path), "qwen3next")
    writer.add_block_count(8 + keys.get("mtp", 0))
    if "mtp" in keys:
        writer.add_nextn_predict_layers(keys["mtp"])
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(16)
    writer.add_value_length(16)
    writer.add_ssm_conv_kernel(4)
    writer.add_ssm_state_size(16)
    writer.add_ssm_group_count(2)
    writer.add_ssm_inner_size(64)
    writer.add_ssm_time_step_rank(4)
    if "interval" in keys:
        writer.add_full_attention_interval(keys["interval"])
    if "recurrent" in keys:
        writer.add_array("qwen3next.attention.recurrent_layers", keys["recurrent"])  # gguf 0.19 has no adder
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_the_recurrent_layer_flags_win_over_the_interval_which_defaults_to_4(tmp_path: Path) -> None:
    """llama.cpp's qwen3next loader: `attention.recurrent_layers` if the GGUF has it (newer converters write it
    from the HF `layer_types`, beside the interval), else `full_attention_interval`, else every 4th layer."""
    flags = [True, False, True, True, False, True, True, True]
    both = inspect_gguf(_qwen3next_header(tmp_path / "both.gguf", interval=4, recurrent=flags)).shape
    assert both.kv_heads_per_layer == (0, 2, 0, 0, 2, 0, 0, 0) and both.recurrent_layers == 6
    interval = inspect_gguf(_qwen3next_header(tmp_path / "interval.gguf", interval=2)).shape
    assert interval.kv_heads_per_layer == (0, 2) * 4
    default = inspect_gguf(_qwen3next_header(tmp_path / "default.gguf")).shape
    assert default.kv_heads_per_layer == (0, 0, 0, 2) * 2
    assert default.recurrent_state_bytes == 4 * (3 * (64 + 2 * 2 * 16) + 16 * 64)


def test_a_multi_token_prediction_block_holds_no_cache(tmp_path: Path) -> None:
    """`nextn_predict_layers` trailing blocks are in `block_count`, but llama.cpp keeps neither KV nor state for
    them (its cache filters take layers below `n_layer() = block_count - nextn` only)."""
    shape = inspect_gguf(_qwen3next_header(tmp_path / "mtp.gguf", mtp=1)).shape
    assert (shape.n_layers, shape.mtp_layers, shape.recurrent_layers) == (9, 1, 6)
    assert shape.kv_bytes_per_token() == 2 * 2 * 32 * 2  # blocks 3 and 7; by the interval block 8 would hold a state
    assert [shape.has_cache(layer) for layer in (0, 7, 8)] == [True, True, False]
