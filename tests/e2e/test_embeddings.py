"""Embeddings and reranking through `voltgate serve` and the real pooled-output worker, driven by the openai SDK.

One gateway for the module serves four models: the real SmolLM2 GGUF as a decoder embedding model (mean
pooling), the tiny random-weight BERT of `tests.fixtures.tiny_bert` as a matryoshka encoder, its reranker
variant, and SmolLM2 as a chat model. The tiny models check shapes, encodings, limits and errors; meaning is
checked on SmolLM2 (similar sentences closer than unrelated ones).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest

from gateway.protocol.rerank import RerankResponse
from tests.conftest import free_port
from tests.e2e.conftest import Gateway, running_gateway, write_config
from tests.fixtures.tiny_bert import CLS_ID, N_CTX_TRAIN, N_EMBD, SEP_ID, vocabulary, write_tiny_bert
from tests.openai_schema import assert_matches_openai

pytestmark = pytest.mark.e2e

EMBED, BERT, RERANK, CHAT = "smollm2-embed", "tiny-bert", "tiny-reranker", "chat"
SMOLLM2_DIM = 576
CAT, CAT_2, REVENUE = "The cat sat on the mat", "A cat is sitting on a mat", "Quarterly revenue grew by 5 percent"
THREADS = {"n_threads": 1}


@pytest.fixture(scope="module")
def gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("embeddings")
    bert, reranker = write_tiny_bert(tmp / "tiny-bert.gguf"), write_tiny_bert(tmp / "tiny-reranker.gguf", rerank=True)
    models: list[dict[str, object]] = [
        {"name": EMBED, "sources": [{"gguf": str(smollm2_path)}], "task": "embed", "pooling": "mean",
         "context": 256, "embed_batch": 8, "llamacpp": THREADS, "alias_patterns": ["text-embedding-*"]},
        {"name": BERT, "sources": [{"gguf": str(bert)}], "matryoshka": True, "context": N_CTX_TRAIN,
         "llamacpp": THREADS},  # task from the GGUF: an encoder declaring mean pooling
        {"name": RERANK, "sources": [{"gguf": str(reranker)}], "context": N_CTX_TRAIN, "llamacpp": THREADS},
        {"name": CHAT, "sources": [{"gguf": str(smollm2_path)}], "context": 1024, "llamacpp": THREADS,
         "alias_patterns": ["gpt-*", "claude-*"]},
    ]  # fmt: skip
    with running_gateway(write_config(tmp, smollm2_path, free_port(), models=models), tmp / "gateway.log") as gw:
        yield gw


def post(gateway: Gateway, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gateway.base_url + path, json=body, timeout=60)


def vectors(result: Any) -> np.ndarray:
    assert [d.index for d in result.data] == list(range(len(result.data)))
    return np.array([d.embedding for d in result.data], dtype=np.float64)


def bert_tokens(text: str) -> list[int]:
    """The tiny BERT's ids of lowercase whole-word text, [CLS] ... [SEP], as its own tokenizer gives them."""
    ids = {t: i for i, t in enumerate(vocabulary())}
    return [CLS_ID, *(ids["\u2581" + w] for w in text.lower().split()), SEP_ID]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- /v1/models --------------------------------------------------------------------------------------------


def test_models_say_which_task_each_model_serves(gateway: Gateway) -> None:
    entries = {m["id"]: m for m in httpx.get(gateway.base_url + "/models").json()["data"]}
    assert {name: e["task"] for name, e in entries.items()} == {
        EMBED: "embed", BERT: "embed", RERANK: "rerank", CHAT: "generate"}  # fmt: skip
    flags = {name: (e["capabilities"]["embeddings"], e["capabilities"]["chat"], e["capabilities"]["rerank"])
             for name, e in entries.items()}  # fmt: skip
    assert flags == {EMBED: (True, False, False), BERT: (True, False, False), RERANK: (False, False, True),
                     CHAT: (False, True, False)}  # fmt: skip


def test_alias_patterns_reach_the_model_of_the_requests_kind(gateway: Gateway) -> None:
    """What `llm embed` and agents ask for by default (`text-embedding-3-small`, `gpt-5.5`, `claude-opus-5-5`)
    is served by the configured model of its kind; the answer names the model that served it."""
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    embedded = client.embeddings.create(model="text-embedding-3-small", input=CAT)
    assert embedded.model == EMBED and len(embedded.data[0].embedding) == SMOLLM2_DIM
    chat = client.chat.completions.create(model="gpt-5.5", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert chat.model == CHAT and chat.choices[0].message.role == "assistant"
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    message = claude.messages.create(
        model="claude-opus-5-5", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.model == "claude-opus-5-5" and message.usage.output_tokens > 0  # Messages echoes the name
    with pytest.raises(openai.NotFoundError) as caught:  # an embedding pattern never reaches the chat model
        client.chat.completions.create(model="text-embedding-3-small", messages=[{"role": "user", "content": "Hi"}])
    assert "'text-embedding-*' of 'smollm2-embed', which serves embed, not generate" in str(caught.value)
    entries = {m["id"]: m for m in httpx.get(gateway.base_url + "/models").json()["data"]}
    assert set(entries) == {EMBED, BERT, RERANK, CHAT}  # patterns are not entries of their own
    assert entries[CHAT]["alias_patterns"] == ["gpt-*", "claude-*"] and entries[BERT]["alias_patterns"] == []


# --- embeddings --------------------------------------------------------------------------------------------


def test_the_sdk_default_base64_and_float_give_the_same_unit_vectors(gateway: Gateway) -> None:
    client = gateway.client()
    encoded = client.embeddings.create(model=EMBED, input=[CAT, REVENUE])  # the SDK asks for base64
    floats = client.embeddings.create(model=EMBED, input=[CAT, REVENUE], encoding_format="float")
    np.testing.assert_array_equal(vectors(encoded).astype(np.float32), vectors(floats).astype(np.float32))
    assert vectors(floats).shape == (2, SMOLLM2_DIM)
    np.testing.assert_allclose(np.linalg.norm(vectors(floats), axis=1), 1.0, atol=1e-6)
    assert floats.model == EMBED and floats.usage.prompt_tokens == floats.usage.total_tokens > 0


def test_responses_match_openais_create_embedding_response_schema(gateway: Gateway) -> None:
    response = post(gateway, "/embeddings", {"model": EMBED, "input": CAT, "user": "alice"})  # `user` dropped
    assert response.status_code == 200, response.text
    assert_matches_openai("CreateEmbeddingResponse", response.json())
    raw = post(gateway, "/embeddings", {"model": EMBED, "input": CAT, "encoding_format": "base64"}).json()
    assert_matches_openai("CreateEmbeddingResponse", {**raw, "data": []})  # the schema types `embedding` as floats
    floats = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(floats, np.array(response.json()["data"][0]["embedding"], dtype=np.float32))


def test_a_batch_equals_its_inputs_one_by_one(gateway: Gateway) -> None:
    client, texts = gateway.client(), [CAT, "hello", REVENUE, "a", CAT_2, "the dog sat in the rain"]
    together = vectors(client.embeddings.create(model=EMBED, input=texts, encoding_format="float"))
    alone = np.concatenate([vectors(client.embeddings.create(model=EMBED, input=t)) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-4, rtol=0)


def test_similar_sentences_are_closer_than_unrelated_ones(gateway: Gateway) -> None:
    cat, cat_2, revenue = vectors(gateway.client().embeddings.create(model=EMBED, input=[CAT, CAT_2, REVENUE]))
    assert cosine(cat, cat_2) > cosine(cat, revenue) + 0.05, (cosine(cat, cat_2), cosine(cat, revenue))


def test_token_arrays_embed_like_the_text_they_spell(gateway: Gateway) -> None:
    client, texts = gateway.client(), ["the cat sat on the mat", "quarterly revenue grew"]
    by_text = vectors(client.embeddings.create(model=BERT, input=texts))
    one = vectors(client.embeddings.create(model=BERT, input=bert_tokens(texts[0])))
    many = vectors(client.embeddings.create(model=BERT, input=[bert_tokens(t) for t in texts]))
    np.testing.assert_allclose(one, by_text[:1], atol=1e-6)
    np.testing.assert_allclose(many, by_text, atol=1e-6)
    assert by_text.shape == (2, N_EMBD)


def test_dimensions_is_refused_by_name_unless_the_model_is_matryoshka(gateway: Gateway) -> None:
    client = gateway.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=EMBED, input=CAT, dimensions=64)
    assert info.value.body["param"] == "dimensions" and "matryoshka" in info.value.body["message"]  # type: ignore[index]
    full = vectors(client.embeddings.create(model=BERT, input=CAT))[0]
    short = vectors(client.embeddings.create(model=BERT, input=CAT, dimensions=16))[0]
    assert short.shape == (16,) and abs(np.linalg.norm(short) - 1) < 1e-6
    np.testing.assert_allclose(short, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    too_many = post(gateway, "/embeddings", {"model": BERT, "input": CAT, "dimensions": N_EMBD + 1})
    assert (too_many.status_code, too_many.json()["error"]["param"]) == (400, "dimensions")


def test_an_over_long_input_is_context_length_exceeded_naming_it(gateway: Gateway) -> None:
    long_text = " ".join(["cat"] * N_CTX_TRAIN)
    response = post(gateway, "/embeddings", {"model": BERT, "input": ["cat", long_text]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input[1]")
    assert str(N_CTX_TRAIN) in error["message"] and "embed_truncate" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ["a"] * 2049}, "input"),
        ({"input": 5}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "stream": True}, "stream"),
        ({"input": [[1, 10**6]]}, "input[0]"),  # an id outside the vocabulary
    ],
)
def test_bad_embedding_requests_are_400s_naming_the_parameter(
    gateway: Gateway, body: dict[str, Any], param: str
) -> None:
    response = post(gateway, "/embeddings", {"model": BERT, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


# --- a model serves its own task only ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"model": EMBED, "messages": [{"role": "user", "content": "hi"}]}),
        ("/completions", {"model": BERT, "prompt": "hi"}),
        ("/embeddings", {"model": CHAT, "input": "hi"}),
        ("/embeddings", {"model": RERANK, "input": "hi"}),
        ("/rerank", {"model": BERT, "query": "q", "documents": ["d"]}),
        ("/rerank", {"model": CHAT, "query": "q", "documents": ["d"]}),
    ],
)
def test_a_request_for_another_task_is_a_400_naming_model(gateway: Gateway, path: str, body: dict[str, Any]) -> None:
    response = post(gateway, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("model", "unsupported_parameter")
    assert f"does not serve /v1{path}" in error["message"]


def test_a_chat_request_to_an_embedding_model_is_refused_through_the_sdk(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        gateway.client().chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["param"] == "model"  # type: ignore[index]


# --- reranking ---------------------------------------------------------------------------------------------


DOCUMENTS = ["the cat sat on the mat", "quarterly revenue grew", "a dog in the rain", "the sun and the moon"]


def test_rerank_orders_every_document_by_score(gateway: Gateway) -> None:
    response = post(gateway, "/rerank", {"model": RERANK, "query": "where is the cat", "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    body = response.json()
    parsed = RerankResponse.model_validate(body)
    scores = [r.relevance_score for r in parsed.results]
    assert sorted(r.index for r in parsed.results) == list(range(len(DOCUMENTS)))
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    assert all("document" not in r for r in body["results"])
    assert (body["model"], body["object"]) == (RERANK, "list")
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(DOCUMENTS)


def test_rerank_top_n_and_return_documents_and_the_reranking_alias(gateway: Gateway) -> None:
    query = {"model": RERANK, "query": "where is the cat", "documents": DOCUMENTS}
    full = post(gateway, "/rerank", query).json()["results"]
    top = post(gateway, "/reranking", {**query, "top_n": 2, "return_documents": True}).json()["results"]
    assert [(r["index"], r["relevance_score"]) for r in top] == [(r["index"], r["relevance_score"]) for r in full[:2]]
    assert [r["document"]["text"] for r in top] == [DOCUMENTS[r["index"]] for r in top]


@pytest.mark.parametrize(
    ("body", "param"),
    [({"query": "q", "documents": []}, "documents"), ({"documents": ["d"]}, "query"),
     ({"query": "q", "documents": ["d"], "top_n": 0}, "top_n"), ({"query": "q", "documents": [1]}, "documents[0]")],
)  # fmt: skip
def test_bad_rerank_requests_are_400s_naming_the_parameter(gateway: Gateway, body: dict[str, Any], param: str) -> None:
    response = post(gateway, "/rerank", {"model": RERANK, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_embedding_and_rerank_requests_are_counted_under_their_endpoints(gateway: Gateway) -> None:
    post(gateway, "/rerank", {"model": RERANK, "query": "q", "documents": ["d"]})
    post(gateway, "/embeddings", {"model": BERT, "input": "a"})
    metrics = httpx.get(gateway.url + "/metrics").text
    assert f'voltgate:requests_total{{endpoint="rerank",model="{RERANK}",status="200"}}' in metrics
    assert f'voltgate:requests_total{{endpoint="embedding",model="{BERT}",status="200"}}' in metrics


# --- LangChain ---------------------------------------------------------------------------------------------


@pytest.fixture
def foreign_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands in for tiktoken's cl100k_base, which tiktoken downloads (there is no network here): byte-level
    ids from 1000 up, outside the tiny BERT's 344 tokens as real cl100k ids of English words are."""
    import tiktoken

    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    ranks = {bytes([b]): 1000 + b for b in range(256)}
    encoding = tiktoken.Encoding(name="cl100k_base", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)


def test_langchain_default_sends_foreign_token_ids_and_gets_a_400_with_the_fix(
    gateway: Gateway, foreign_tokenizer: None
) -> None:
    """LangChain's default `check_embedding_ctx_length=True` tokenizes with tiktoken and sends the ids."""
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=BERT, base_url=gateway.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        embeddings.embed_documents([CAT])
    error: dict[str, Any] = info.value.body  # type: ignore[assignment]
    assert error["param"] == "input[0]" and "check_embedding_ctx_length=False" in error["message"]


def test_langchain_with_check_embedding_ctx_length_false_sends_text(gateway: Gateway) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=EMBED, base_url=gateway.base_url, api_key="unused", max_retries=0, check_embedding_ctx_length=False
    )
    documents = np.array(embeddings.embed_documents([CAT, REVENUE]))
    query = np.array(embeddings.embed_query(CAT_2))
    expected = vectors(gateway.client().embeddings.create(model=EMBED, input=[CAT, REVENUE, CAT_2]))
    np.testing.assert_allclose(documents, expected[:2], atol=1e-6)
    np.testing.assert_allclose(query, expected[2], atol=1e-6)
