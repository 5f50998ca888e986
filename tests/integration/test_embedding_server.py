"""The embedding worker's routes in-process (Starlette's TestClient runs the lifespan), over `FakeEmbeddingModel`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from backends.llamacpp.worker import embed_server
from backends.llamacpp.worker.embed_server import EmbedSpec, Task, create_app
from backends.llamacpp.worker.embedding import EmbeddingOptions
from backends.llamacpp.worker.native import NativeError
from backends.request import MAX_INPUTS
from tests.integration.test_embedding_engine import FakeEmbeddingModel
from tests.openai_schema import assert_matches_openai


def spec(task: Task = "embed", **kwargs: Any) -> EmbedSpec:
    options = EmbeddingOptions(max_input_tokens=16, n_seq_max=4)
    return EmbedSpec(model_path=Path("fake.gguf"), model_name="fake", task=task, options=options, **kwargs)


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., tuple[TestClient, FakeEmbeddingModel, list[str]]]]:
    """Start the app on a fake model (`loader` replaces the model constructor); yields (client, model, fatal)."""
    clients: list[TestClient] = []

    def _serve(
        worker_spec: EmbedSpec | None = None,
        model: FakeEmbeddingModel | None = None,
        loader: Callable[..., Any] | None = None,
    ) -> tuple[TestClient, FakeEmbeddingModel, list[str]]:
        fake = model or FakeEmbeddingModel(pooling="rank" if worker_spec and worker_spec.task == "rerank" else "mean")
        monkeypatch.setattr(embed_server, "EmbeddingModel", loader or (lambda _path, _options: fake))
        fatal: list[str] = []
        client = TestClient(create_app(worker_spec or spec(), fatal.append).asgi)
        client.__enter__()
        clients.append(client)
        return client, fake, fatal

    yield _serve
    for client in clients:
        client.__exit__(None, None, None)


def ready(client: TestClient) -> None:
    deadline = time.monotonic() + 5
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return dict(error)


def test_the_worker_takes_the_gateways_input_limit() -> None:
    assert spec().max_inputs == MAX_INPUTS == 2048


def test_health_models_and_requests_answer_503_until_loaded(serve: Callable[..., Any]) -> None:
    release = threading.Event()
    fake = FakeEmbeddingModel()

    def slow_load(_path: Path, _options: EmbeddingOptions) -> FakeEmbeddingModel:
        release.wait(5)
        return fake

    client, _, _ = serve(loader=slow_load)
    assert client.get("/health").json() == {"status": "loading"}
    assert client.get("/health").status_code == 503
    assert error_of(client.get("/v1/models"), 503)["code"] == "worker_loading"
    assert (
        error_of(client.post("/v1/embeddings", json={"model": "fake", "input": "a"}), 503)["code"] == "worker_loading"
    )
    release.set()
    ready(client)
    health = client.get("/health").json()
    assert (health["status"], health["task"], health["pooling"], health["n_embd"]) == ("ok", "embed", "mean", 8)
    assert client.get("/v1/models").json()["data"][0]["id"] == "fake"


def test_embeddings_render_openais_shape(serve: Callable[..., Any]) -> None:
    client, model, _ = serve()
    ready(client)
    body = client.post("/v1/embeddings", json={"model": "fake", "input": ["one two", "three"]}).json()
    assert_matches_openai("CreateEmbeddingResponse", body)
    assert body["model"] == "fake" and body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert model.calls == [[[1, 13, 13, 2], [1, 15, 2]]]
    token_body = client.post("/v1/embeddings", json={"model": "fake", "input": [1, 13, 13, 2]}).json()
    assert token_body["data"][0]["embedding"] == body["data"][0]["embedding"]


def test_dimensions_needs_matryoshka_and_fits_the_model(serve: Callable[..., Any]) -> None:
    client, _, _ = serve()
    ready(client)
    refused = error_of(client.post("/v1/embeddings", json={"model": "fake", "input": "a", "dimensions": 4}), 400)
    assert refused["param"] == "dimensions"
    mrl, _, _ = serve(spec(matryoshka=True))
    ready(mrl)
    body = mrl.post("/v1/embeddings", json={"model": "fake", "input": "a", "dimensions": 4}).json()
    assert len(body["data"][0]["embedding"]) == 4
    assert error_of(mrl.post("/v1/embeddings", json={"model": "fake", "input": "a", "dimensions": 9}), 400)[
        "param"
    ] == ("dimensions")


def test_over_long_inputs_are_refused_or_truncated_keeping_the_end_token(serve: Callable[..., Any]) -> None:
    client, model, _ = serve()
    ready(client)
    long_text = " ".join(["word"] * 20)  # 22 tokens > 16
    error = error_of(client.post("/v1/embeddings", json={"model": "fake", "input": ["a", long_text]}), 400)
    assert (error["param"], error["code"]) == ("input[1]", "context_length_exceeded")
    body = client.post("/v1/embeddings", json={"model": "fake", "input": long_text, "truncate": True}).json()
    assert body["usage"]["prompt_tokens"] == 16
    assert model.calls[-1] == [[1, *[14] * 14, 2]]


def test_bad_token_ids_empty_inputs_and_too_many_inputs_are_400(serve: Callable[..., Any]) -> None:
    client, _, _ = serve(spec(max_inputs=3))
    ready(client)
    assert (
        error_of(client.post("/v1/embeddings", json={"model": "fake", "input": [[1, 100]]}), 400)["param"] == "input[0]"
    )
    assert error_of(client.post("/v1/embeddings", json={"model": "fake", "input": []}), 400)["param"] == "input"
    assert error_of(client.post("/v1/embeddings", json={"model": "fake", "input": ["a"] * 4}), 400)["param"] == "input"


def test_a_full_queue_is_429(serve: Callable[..., Any]) -> None:
    client, _, _ = serve(spec(max_queue=0))
    ready(client)
    error = error_of(client.post("/v1/embeddings", json={"model": "fake", "input": "a"}), 429)
    assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")


def test_rerank_scores_each_framed_pair_and_sorts(serve: Callable[..., Any]) -> None:
    client, model, _ = serve(spec("rerank"))
    ready(client)
    documents = ["a bb", "ccc", "dddd e"]
    body = client.post("/v1/rerank", json={"model": "fake", "query": "q", "documents": documents}).json()
    pairs = [[1, 11, 2, 11, 12], [1, 11, 2, 13], [1, 11, 2, 14, 11]]
    assert model.calls == [pairs]
    scores = model.embed(pairs)[:, 0].tolist()
    assert [r["index"] for r in body["results"]] == sorted(range(3), key=lambda i: -scores[i])
    assert body["usage"] == {"prompt_tokens": 14, "total_tokens": 14}
    assert (
        error_of(client.post("/v1/embeddings", json={"model": "fake", "input": "a"}), 400)["code"] == "unsupported_task"
    )


def test_a_failed_load_is_fatal(serve: Callable[..., Any]) -> None:
    def broken(_path: Path, _options: EmbeddingOptions) -> FakeEmbeddingModel:
        raise NativeError("failed to load model from fake.gguf")

    client, _, fatal = serve(loader=broken)
    deadline = time.monotonic() + 5
    while not fatal:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "failed to load" in fatal[0]
    assert client.get("/health").status_code == 503


def test_a_model_whose_pooling_does_not_fit_the_task_is_fatal(serve: Callable[..., Any]) -> None:
    _, _, fatal = serve(spec("embed"), FakeEmbeddingModel(pooling="rank"))
    deadline = time.monotonic() + 5
    while not fatal:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "--task rerank" in fatal[0]
