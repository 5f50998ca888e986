"""Embedding/rerank pure parts: pass planning, normalisation, rendering, ranking, body parsing, argv, wire types."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from backends.llamacpp.worker.cli import build_parser, embed_spec_from_args, main
from backends.llamacpp.worker.embed_server import (
    EmbedSpec,
    rank_results,
    render_embeddings,
)
from backends.llamacpp.worker.embedding import finish_vectors, plan_passes
from backends.request import EngineEmbeddingRequest, EngineRerankRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.rerank import RerankRequest, RerankResponse
from tests.openai_schema import assert_matches_openai

# --- passes ----------------------------------------------------------------------------------------


def test_passes_fill_up_to_the_token_budget() -> None:
    assert plan_passes([4, 4, 4, 4, 4], max_tokens=10, max_seqs=8) == [range(0, 2), range(2, 4), range(4, 5)]


def test_passes_fill_up_to_the_sequence_budget() -> None:
    assert plan_passes([1] * 7, max_tokens=100, max_seqs=3) == [range(0, 3), range(3, 6), range(6, 7)]


def test_an_input_filling_a_pass_runs_alone_and_order_is_kept() -> None:
    assert plan_passes([2, 10, 3, 7], max_tokens=10, max_seqs=4) == [range(0, 1), range(1, 2), range(2, 4)]
    assert plan_passes([], max_tokens=10, max_seqs=4) == []


@pytest.mark.parametrize("length", [0, 11])
def test_an_input_no_pass_can_hold_is_a_programming_error(length: int) -> None:
    with pytest.raises(ValueError, match="input 1"):
        plan_passes([3, length], max_tokens=10, max_seqs=4)


# --- normalisation -----------------------------------------------------------------------------------


def test_vectors_are_scaled_to_unit_length_and_a_zero_row_stays_zero() -> None:
    raw = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    out = finish_vectors(raw, dimensions=None, normalize=True)
    np.testing.assert_allclose(out, [[0.6, 0.8, 0.0], [0.0, 0.0, 0.0]], atol=1e-7)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(raw[0], [3.0, 4.0, 0.0])  # the input is left alone


def test_dimensions_keeps_a_prefix_then_renormalises() -> None:
    raw = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    np.testing.assert_allclose(finish_vectors(raw, dimensions=2, normalize=True), [[0.6, 0.8]], atol=1e-7)
    np.testing.assert_array_equal(finish_vectors(raw, dimensions=2, normalize=False), [[3.0, 4.0]])
    np.testing.assert_array_equal(finish_vectors(raw, dimensions=None, normalize=False), raw)


# --- rendering -----------------------------------------------------------------------------------


def test_float_rendering_is_openais_shape_and_exact_float32() -> None:
    vectors = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    body = json.loads(render_embeddings(vectors, model="m", encoding_format="float", prompt_tokens=7))
    assert_matches_openai("CreateEmbeddingResponse", body)
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    np.testing.assert_array_equal(np.array([d["embedding"] for d in body["data"]], dtype=np.float32), vectors)


def test_base64_rendering_is_little_endian_float32_bytes() -> None:
    vectors = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    body = json.loads(render_embeddings(vectors, model="m", encoding_format="base64", prompt_tokens=2))
    for row, item in zip(vectors, body["data"], strict=True):
        assert base64.b64decode(item["embedding"]) == row.astype("<f4").tobytes()


# --- ranking -------------------------------------------------------------------------------------


def test_results_are_by_descending_score_with_ties_in_document_order() -> None:
    results = rank_results([0.1, 0.9, 0.5, 0.9], ["a", "b", "c", "d"], top_n=None, return_documents=False)
    assert [r["index"] for r in results] == [1, 3, 2, 0]
    assert all(set(r) == {"index", "relevance_score"} for r in results)


def test_top_n_and_return_documents() -> None:
    results = rank_results([0.1, 0.9, 0.5], ["a", "b", "c"], top_n=2, return_documents=True)
    assert results == [
        {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
        {"index": 2, "relevance_score": 0.5, "document": {"text": "c"}},
    ]
    assert len(rank_results([1.0], ["a"], top_n=5, return_documents=False)) == 1


# --- engine wire types (body parsing: tests/unit/test_worker_httpkit.py) ---------------------------------


def test_engine_requests_accept_every_input_form_and_drop_defaults_on_the_wire() -> None:
    for value in ("a", ["a", "b"], [1, 2], [[1], [2, 3]]):
        assert EngineEmbeddingRequest(model="m", input=value).wire() == {"model": "m", "input": value}
    wire = EngineEmbeddingRequest(model="m", input="a", dimensions=8, truncate=True).wire()
    assert wire == {"model": "m", "input": "a", "dimensions": 8, "truncate": True}
    with pytest.raises(ValidationError):
        EngineRerankRequest(model="m", query="q", documents=[])


# --- gateway rerank wire types -----------------------------------------------------------------------


def test_rerank_request_becomes_the_engine_request() -> None:
    request = RerankRequest.model_validate(
        {"model": "r", "query": "q", "documents": ["a", "b"], "top_n": 1, "metadata": {"ignored": True}}
    )
    engine = request.to_engine(EngineTarget(model="r-worker"))
    assert engine.wire() == {"model": "r-worker", "query": "q", "documents": ["a", "b"], "top_n": 1}
    with pytest.raises(ValidationError):
        RerankRequest.model_validate({"model": "r", "query": "q", "documents": ["a"] * 2049})


def test_rerank_response_renders_documents_only_when_present() -> None:
    body = {
        "model": "r",
        "object": "list",
        "results": [
            {"index": 1, "relevance_score": 2.5},
            {"index": 0, "relevance_score": -1.0, "document": {"text": "a"}},
        ],
        "usage": {"prompt_tokens": 9, "total_tokens": 9},
    }
    assert RerankResponse.model_validate(body).render() == body


# --- worker argv -----------------------------------------------------------------------------------


def spec_for(*argv: str) -> EmbedSpec:
    base = ["--model", "m.gguf", "--model-name", "e", "--port", "1", "--ctx", "512", "--slots", "16"]
    return embed_spec_from_args(build_parser().parse_args([*base, *argv]))


def test_embed_argv_maps_to_the_spec() -> None:
    spec = spec_for("--task", "embed", "--pooling", "cls", "--matryoshka", "--n-threads", "3", "--n-batch", "256")
    assert (spec.task, spec.model_path, spec.model_name, spec.matryoshka) == ("embed", Path("m.gguf"), "e", True)
    options = spec.options
    assert (options.max_input_tokens, options.n_seq_max, options.n_threads) == (512, 16, 3)
    assert options.n_batch == 512  # a pass always holds the longest input
    assert (options.pooling, options.cache_type) == ("cls", "bf16")


def test_rerank_defaults_to_pooling_rank_and_gpu_layers_to_an_f16_cache() -> None:
    spec = spec_for("--task", "rerank", "--n-gpu-layers", "-1")
    assert (spec.options.pooling, spec.options.cache_type, spec.matryoshka) == ("rank", "f16", False)
    assert spec_for("--task", "embed").options.pooling is None  # the GGUF's own


def test_pooling_without_an_embedding_task_is_a_usage_error() -> None:
    argv = ["--model", "m.gguf", "--model-name", "e", "--port", "1", "--ctx", "8", "--slots", "1", "--pooling", "mean"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
