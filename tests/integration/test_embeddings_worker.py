"""The embedding/rerank worker as a real process (`python -m backends.llamacpp.worker --task embed|rerank`).

Three models, all loaded by the real llama.cpp: a tiny random-weight BERT written by `tests.fixtures.tiny_bert`
(the encoder path: llama_encode, no KV cache), the same BERT with a classifier head and pooling rank (the
reranker path), and the real SmolLM2-135M GGUF as a decoder embedding model with mean pooling (llama_decode
with its KV cache cleared between passes).

The tiny models' weights are random, so their tests check the arithmetic and the wire (shapes, norms,
batch-invariance, base64 bytes, truncation, ordering consistent with each pair's own score), not meaning;
meaning is checked on SmolLM2 (similar sentences closer than unrelated ones).
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai.types import CreateEmbeddingResponse

from gateway.protocol.rerank import RerankResponse
from tests.fixtures.tiny_bert import CLS_ID, N_CTX_TRAIN, N_EMBD, SEP_ID, vocabulary, write_tiny_bert
from tests.openai_schema import assert_matches_openai
from tests.worker_process import running_worker, start_worker, stop

pytestmark = pytest.mark.integration

WORD_START = "\u2581"
CAT = "The cat sat on the mat"
CAT_2 = "A cat is sitting on a mat"
REVENUE = "Quarterly revenue grew by 5 percent"
TEXTS = [CAT, "hello world", REVENUE, "a", "the dog and the cat sat on the road in the rain"]


@dataclass
class Worker:
    url: str
    name: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/health", timeout=5)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json={"model": self.name, **body}, timeout=60)

    def ok(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.post(path, body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def embed(self, inputs: Any, **params: Any) -> np.ndarray:
        data = self.ok("/v1/embeddings", {"input": inputs, **params})["data"]
        assert [d["index"] for d in data] == list(range(len(data)))
        return np.array([d["embedding"] for d in data], dtype=np.float64)


def _module_worker(tmp_path_factory: pytest.TempPathFactory, model: Path, name: str, *args: str) -> Iterator[Worker]:
    """A worker serving `model` as `name`, ready (only 503s before /health's 200), stopped after the module."""
    log_path = tmp_path_factory.mktemp(name) / "worker.log"
    with running_worker(model, log_path, "--n-threads", "1", *args, name=name) as (process, url):
        yield Worker(url, name, log_path, process)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("gguf") / "tiny-bert.gguf")


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("gguf") / "tiny-reranker.gguf", rerank=True)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Iterator[Worker]:
    # --slots 4: a pass holds at most 4 inputs, so TEXTS (5 inputs) takes two passes.
    args = ("--task", "embed", "--ctx", str(N_CTX_TRAIN), "--slots", "4", "--n-batch", "256")
    yield from _module_worker(tmp_path_factory, tiny_bert, "tiny-bert", *args)


@pytest.fixture(scope="module")
def matryoshka(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Iterator[Worker]:
    args = ("--task", "embed", "--ctx", str(N_CTX_TRAIN), "--slots", "8", "--matryoshka")
    yield from _module_worker(tmp_path_factory, tiny_bert, "tiny-bert-mrl", *args)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory, tiny_reranker: Path) -> Iterator[Worker]:
    args = ("--task", "rerank", "--ctx", str(N_CTX_TRAIN), "--slots", "4")
    yield from _module_worker(tmp_path_factory, tiny_reranker, "tiny-reranker", *args)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Worker]:
    args = ("--task", "embed", "--pooling", "mean", "--ctx", "256", "--slots", "8", "--n-batch", "512")
    yield from _module_worker(tmp_path_factory, smollm2_path, "smollm2-embed", *args)


def assert_error(response: httpx.Response, status: int, param: str | None, code: str = "invalid_request_error") -> str:
    """The response is OpenAI's error envelope with this status, param and code (the gateway's `ErrorCode`
    values: the worker shares them); returns the message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("invalid_request_error" if status == 400 else error["type"])
    assert error["param"] == param, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


def token_ids(text: str) -> list[int]:
    """The tiny BERT's tokens of lowercase whole-word text, [CLS] ... [SEP] (each word is in the vocabulary)."""
    ids = {t: i for i, t in enumerate(vocabulary())}
    return [CLS_ID, *(ids[WORD_START + w] for w in text.lower().split()), SEP_ID]


# --- the tiny BERT: shapes, norms, batching, encodings -----------------------------------------------


def test_health_and_models_describe_an_embedding_worker(bert: Worker) -> None:
    health = bert.health()
    assert health["status"] == "ok"
    assert (health["task"], health["pooling"], health["n_embd"]) == ("embed", "mean", N_EMBD)
    assert health["max_input_tokens"] == N_CTX_TRAIN
    assert health["n_seq_max"] == 4
    models = httpx.get(f"{bert.url}/v1/models").json()
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [("tiny-bert", "model", "voltgate")]


def test_embeddings_response_is_openais_shape_with_unit_vectors(bert: Worker) -> None:
    body = bert.ok("/v1/embeddings", {"input": TEXTS})
    assert_matches_openai("CreateEmbeddingResponse", body)
    parsed = CreateEmbeddingResponse.model_validate(body)
    assert parsed.model == "tiny-bert"
    assert [e.index for e in parsed.data] == list(range(len(TEXTS)))
    vectors = np.array([e.embedding for e in parsed.data])
    assert vectors.shape == (len(TEXTS), N_EMBD)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens >= sum(len(t.split()) + 2 for t in TEXTS)


def test_batch_results_equal_one_by_one_results(bert: Worker) -> None:
    together = bert.embed(TEXTS)
    alone = np.concatenate([bert.embed(text) for text in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)
    assert bert.health()["inputs_total"] >= 2 * len(TEXTS)


def test_base64_is_the_float32_bytes_of_the_float_vectors(bert: Worker) -> None:
    floats = bert.ok("/v1/embeddings", {"input": TEXTS})["data"]
    encoded = bert.ok("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"})
    assert_matches_openai("CreateEmbeddingResponse", {**encoded, "data": []})
    for f, e in zip(floats, encoded["data"], strict=True):
        assert e["object"] == "embedding" and e["index"] == f["index"]
        assert base64.b64decode(e["embedding"]) == np.array(f["embedding"], dtype="<f4").tobytes()


def test_openai_sdk_reads_the_worker(bert: Worker) -> None:
    """The SDK asks for base64 by default and decodes it: it must see the same vectors as our float output."""
    client = openai.OpenAI(base_url=f"{bert.url}/v1", api_key="unused", max_retries=0)
    result = client.embeddings.create(model="tiny-bert", input=[CAT, REVENUE])
    np.testing.assert_array_equal(
        np.array([d.embedding for d in result.data], dtype=np.float32), bert.embed([CAT, REVENUE]).astype(np.float32)
    )


def test_token_arrays_embed_like_the_text_they_spell(bert: Worker) -> None:
    texts = ["the cat sat on the mat", "quarterly revenue grew"]
    by_text = bert.embed(texts)
    np.testing.assert_allclose(bert.embed(token_ids(texts[0])), by_text[:1], atol=1e-6)
    np.testing.assert_allclose(bert.embed([token_ids(t) for t in texts]), by_text, atol=1e-6)
    usage = bert.ok("/v1/embeddings", {"input": token_ids(texts[0])})["usage"]
    assert usage["prompt_tokens"] == len(token_ids(texts[0])) == 8


def test_normalize_false_returns_the_raw_pooled_vector(bert: Worker) -> None:
    raw = bert.embed(CAT, normalize=False)
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    np.testing.assert_allclose(raw / np.linalg.norm(raw), bert.embed(CAT), atol=1e-6)


def test_over_long_input_is_refused_with_context_length_exceeded(bert: Worker) -> None:
    long_text = " ".join(["cat"] * N_CTX_TRAIN)  # + [CLS] and [SEP]: 2 tokens over
    message = assert_error(bert.post("/v1/embeddings", {"input": long_text}), 400, "input", "context_length_exceeded")
    assert str(N_CTX_TRAIN) in message
    assert_error(bert.post("/v1/embeddings", {"input": ["cat", long_text]}), 400, "input[1]", "context_length_exceeded")
    tokens = [CLS_ID] + [5] * N_CTX_TRAIN + [SEP_ID]
    assert_error(bert.post("/v1/embeddings", {"input": tokens}), 400, "input", "context_length_exceeded")


def test_truncate_cuts_an_over_long_input_to_the_context_keeping_sep(bert: Worker) -> None:
    long_text = " ".join(["cat"] * (N_CTX_TRAIN + 40))
    body = bert.ok("/v1/embeddings", {"input": long_text, "truncate": True})
    assert body["usage"]["prompt_tokens"] == N_CTX_TRAIN
    words = " ".join(["cat"] * (N_CTX_TRAIN - 2))  # exactly the context: [CLS] + 126 words + [SEP]
    np.testing.assert_allclose(bert.embed(long_text, truncate=True), bert.embed(words), atol=1e-6)


def test_a_huge_input_is_refused_or_cut_by_its_bytes_before_tokenization(bert: Worker) -> None:
    """Issue 35 item 2 for embeddings: 4 MB of text is refused by its byte count alone (the message says so),
    and with `truncate` gives the embedding of its first tokens, as a short text of those words does."""
    huge = "cat " * 1_000_000
    message = assert_error(bert.post("/v1/embeddings", {"input": huge}), 400, "input", "context_length_exceeded")
    assert "refused before tokenization" in message and "at least" in message
    words = " ".join(["cat"] * (N_CTX_TRAIN - 2))
    np.testing.assert_allclose(bert.embed(huge, truncate=True), bert.embed(words), atol=1e-6)
    # an input the bound lets through is still counted in tokens, as before
    over = " ".join(["cat"] * N_CTX_TRAIN)
    assert "refused before" not in assert_error(bert.post("/v1/embeddings", {"input": over}), 400, "input",
                                                "context_length_exceeded")  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 5}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": [[2, 3], "a"]}, "input"),
        ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "user": "x"}, "user"),
        ({"input": []}, "input"),
        ({"input": [[2, 999999]]}, "input[0]"),
        ({}, "input"),
    ],
)
def test_bad_bodies_are_400_in_openais_error_shape(bert: Worker, body: dict[str, Any], param: str) -> None:
    assert_error(bert.post("/v1/embeddings", body), 400, param)


def test_invalid_json_and_non_object_bodies_are_400(bert: Worker) -> None:
    for content, code in ((b"{not json", "invalid_json"), (b"[1, 2]", "invalid_request_error")):
        response = httpx.post(f"{bert.url}/v1/embeddings", content=content, timeout=10)
        assert_error(response, 400, None, code)


def test_too_many_inputs_are_refused_naming_input(bert: Worker) -> None:
    assert_error(bert.post("/v1/embeddings", {"input": ["cat"] * 2049}), 400, "input")


def test_dimensions_is_refused_by_a_model_not_served_as_matryoshka(bert: Worker) -> None:
    message = assert_error(bert.post("/v1/embeddings", {"input": CAT, "dimensions": 16}), 400, "dimensions")
    assert "dimensions" in message


def test_rerank_on_an_embedding_worker_is_refused(bert: Worker) -> None:
    response = bert.post("/v1/rerank", {"query": "q", "documents": ["d"]})
    assert_error(response, 400, None, "unsupported_task")


def test_dimensions_truncates_then_renormalises_on_a_matryoshka_model(matryoshka: Worker) -> None:
    full = matryoshka.embed([CAT, REVENUE])
    short = matryoshka.embed([CAT, REVENUE], dimensions=16)
    assert short.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-6)
    prefix = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, prefix, atol=1e-6)
    encoded = matryoshka.ok("/v1/embeddings", {"input": CAT, "dimensions": 16, "encoding_format": "base64"})
    assert len(base64.b64decode(encoded["data"][0]["embedding"])) == 16 * 4
    assert_error(matryoshka.post("/v1/embeddings", {"input": CAT, "dimensions": N_EMBD + 1}), 400, "dimensions")


# --- the tiny reranker ---------------------------------------------------------------------------


DOCUMENTS = ["a cat sat on the mat", "revenue grew by 5 percent", "the dog is home", "paris is in france"]


def scores_alone(reranker: Worker, query: str) -> list[float]:
    scores = []
    for document in DOCUMENTS:
        (result,) = reranker.ok("/v1/rerank", {"query": query, "documents": [document]})["results"]
        scores.append(result["relevance_score"])
    return scores


def test_rerank_orders_documents_by_their_own_scores(reranker: Worker) -> None:
    body = reranker.ok("/v1/rerank", {"query": "what is a cat", "documents": DOCUMENTS})
    parsed = RerankResponse.model_validate(body)
    assert parsed.model == "tiny-reranker" and parsed.object == "list"
    assert sorted(r.index for r in parsed.results) == list(range(len(DOCUMENTS)))
    scores = [r.relevance_score for r in parsed.results]
    assert scores == sorted(scores, reverse=True)
    assert all("document" not in r for r in body["results"])
    alone = scores_alone(reranker, "what is a cat")
    for result in parsed.results:  # batch-invariant: each pair scores the same with or without the others
        assert result.relevance_score == pytest.approx(alone[result.index], abs=1e-5)
    # llama.cpp's framing for a BERT vocabulary (no EOS): [CLS] query [SEP] document; one token per word here.
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == sum(1 + 4 + 1 + len(d.split()) for d in DOCUMENTS)


def test_rerank_top_n_and_return_documents(reranker: Worker) -> None:
    full = reranker.ok("/v1/rerank", {"query": "what is a cat", "documents": DOCUMENTS})["results"]
    body = reranker.ok(
        "/v1/rerank", {"query": "what is a cat", "documents": DOCUMENTS, "top_n": 2, "return_documents": True}
    )
    assert [r["index"] for r in body["results"]] == [r["index"] for r in full[:2]]
    assert [r["document"] for r in body["results"]] == [{"text": DOCUMENTS[r["index"]]} for r in full[:2]]
    alias = reranker.ok("/v1/reranking", {"query": "what is a cat", "documents": DOCUMENTS, "top_n": 1})
    assert alias["results"] == [full[0]]


def test_rerank_refusals(reranker: Worker) -> None:
    assert_error(reranker.post("/v1/rerank", {"query": "q", "documents": []}), 400, "documents")
    assert_error(reranker.post("/v1/rerank", {"documents": ["d"]}), 400, "query")
    assert_error(reranker.post("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}), 400, "top_n")
    long_doc = " ".join(["cat"] * N_CTX_TRAIN)
    response = reranker.post("/v1/rerank", {"query": "q", "documents": ["d", long_doc]})
    assert_error(response, 400, "documents[1]", "context_length_exceeded")
    assert_error(reranker.post("/v1/embeddings", {"input": "x"}), 400, None, "unsupported_task")
    assert reranker.health()["pooling"] == "rank"


def test_a_reranker_gguf_served_for_embeddings_fails_at_load(tiny_reranker: Path, tmp_path: Path) -> None:
    args = ("--n-threads", "1", "--task", "embed", "--ctx", "64", "--slots", "2")
    process, _ = start_worker(tiny_reranker, tmp_path / "worker.log", *args, name="wrong")
    try:
        assert process.wait(60) == 1
    finally:
        stop(process)
    assert "--task rerank" in (tmp_path / "worker.log").read_text()


# --- SmolLM2 as a decoder embedding model ------------------------------------------------------------


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_decoder_model_puts_similar_sentences_closer(smollm2: Worker) -> None:
    body = smollm2.ok("/v1/embeddings", {"input": [CAT, CAT_2, REVENUE]})
    assert_matches_openai("CreateEmbeddingResponse", body)
    cat, cat_2, revenue = np.array([d["embedding"] for d in body["data"]])
    assert cat.shape == (576,)
    np.testing.assert_allclose(np.linalg.norm([cat, cat_2, revenue], axis=1), 1.0, atol=1e-6)
    assert cosine(cat, cat_2) > cosine(cat, revenue) + 0.1
    assert cosine(cat, cat_2) > cosine(cat_2, revenue) + 0.1


def test_decoder_batch_results_equal_one_by_one_results(smollm2: Worker) -> None:
    together = smollm2.embed(TEXTS)
    alone = np.concatenate([smollm2.embed(text) for text in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)


async def test_concurrent_requests_share_forward_passes(smollm2: Worker) -> None:
    before = smollm2.health()
    inputs = [f"{CAT}, and then {REVENUE.lower()}", CAT_2]  # 2 inputs: a round (8 inputs) holds 4 requests
    async with httpx.AsyncClient(base_url=smollm2.url, timeout=60) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/embeddings", json={"model": smollm2.name, "input": inputs}) for _ in range(12))
        )
    assert all(r.status_code == 200 for r in responses)
    first = np.array([d["embedding"] for d in responses[0].json()["data"]])
    for response in responses[1:]:
        np.testing.assert_allclose(np.array([d["embedding"] for d in response.json()["data"]]), first, atol=1e-5)
    after = smollm2.health()
    assert after["requests_total"] - before["requests_total"] == 12
    assert after["rounds_total"] - before["rounds_total"] < 12  # requests that arrived together ran together


def test_decoder_without_pooling_metadata_needs_pooling(smollm2_path: Path, tmp_path: Path) -> None:
    args = ("--n-threads", "1", "--task", "embed", "--ctx", "64", "--slots", "2")
    process, _ = start_worker(smollm2_path, tmp_path / "worker.log", *args, name="smol")
    try:
        assert process.wait(60) == 1
    finally:
        stop(process)
    assert "--pooling" in (tmp_path / "worker.log").read_text()
