"""The embedding worker's HTTP surface: /v1/embeddings or /v1/rerank over an `EmbeddingEngine`, /health, /v1/models.

The same process kind as the generation worker (`python -m backends.llamacpp.worker --task embed|rerank`),
with the same readiness contract: /health and /v1/models answer 503 until the model is loaded. Bodies are
validated with `EngineEmbeddingRequest` / `EngineRerankRequest`; every refusal is OpenAI's error envelope.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive

from backends.errors import ErrorCode
from backends.llamacpp.worker.embedding import (
    EmbeddingEngine,
    EmbeddingModel,
    EmbeddingOptions,
    EngineClosedError,
    QueueFullError,
    Vectors,
    finish_vectors,
)
from backends.llamacpp.worker.httpkit import (
    WorkerApp,
    WorkerError,
    client_closed,
    invalid,
    loading,
    model_list,
    parse_body,
    until_disconnected,
)
from backends.request import MAX_INPUTS, EngineEmbeddingRequest, EngineRerankRequest

log = logging.getLogger("voltgate.worker")

Task = Literal["embed", "rerank"]
B = TypeVar("B", bound=BaseModel)


@dataclass(frozen=True)
class EmbedSpec:
    """Everything an embedding or rerank worker was started with."""

    model_path: Path
    model_name: str
    task: Task
    options: EmbeddingOptions
    max_queue: int = 64
    max_inputs: int = MAX_INPUTS
    matryoshka: bool = False


FOREIGN_TOKENS_HINT = (
    "Token arrays must come from this model's own tokenizer; send text otherwise. LangChain's OpenAIEmbeddings "
    "sends OpenAI's tiktoken ids unless created with check_embedding_ctx_length=False"
)
_INPUT_FORMS = "'input' must be a string, a list of strings, a token array (list of ints) or a list of token arrays"


def _float32_base64(row: Vectors) -> str:
    return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")


def render_embeddings(
    vectors: Vectors, *, model: str, encoding_format: Literal["float", "base64"], prompt_tokens: int
) -> bytes:
    """OpenAI's CreateEmbeddingResponse as JSON bytes (base64: each vector's little-endian float32 bytes)."""
    if encoding_format == "base64":
        rows: list[Any] = [_float32_base64(row) for row in vectors]
    else:
        rows = vectors.tolist()  # float32 -> float is exact: the JSON numbers read back as the same float32
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def rank_results(
    scores: Sequence[float], documents: Sequence[str], *, top_n: int | None, return_documents: bool
) -> list[dict[str, Any]]:
    """Results by descending score (ties keep document order), cut to `top_n`."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    results: list[dict[str, Any]] = []
    for i in order[:top_n]:
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return results


def _input_items(raw: str | list[str] | list[int] | list[list[int]]) -> tuple[list[str | list[int]], bool]:
    """The inputs one by one (texts or token arrays), and whether the client sent a list of them."""
    if isinstance(raw, str):
        return [raw], False
    if raw and all(isinstance(t, int) for t in raw):
        return [[t for t in raw if isinstance(t, int)]], False  # one token array
    return [item for item in raw if not isinstance(item, int)], True


class _State:
    def __init__(self, spec: EmbedSpec) -> None:
        self.spec = spec
        self.engine: EmbeddingEngine | None = None
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closing = False

    def begin_shutdown(self) -> None:
        """Signal-handler safe: fail queued requests now instead of letting graceful shutdown wait for them."""
        self.closing = True
        if self.loop is not None and self.engine is not None:
            self.loop.call_soon_threadsafe(self.engine.shutdown)


def _check_task(spec: EmbedSpec, model: EmbeddingModel) -> None:
    if spec.task == "rerank" and model.pooling != "rank":
        raise ValueError(f"--task rerank needs pooling rank (a reranker GGUF), but the model pools by {model.pooling}")
    if spec.task == "embed" and model.pooling == "rank":
        raise ValueError("the model pools by rank (a reranker): serve it with --task rerank")


NORMALIZING_SLACK = 4
"""The byte bound's allowance for tokenizers that normalize (BERT's WordPiece drops accents and spaces): an input
is refused before tokenization only when even this many times the longest token's bytes per token is over."""


def _bounded(text: str, longest: int, limit: int, truncate: bool, param: str) -> str:
    """`text`, unless its bytes alone are more tokens than `limit` (issue 35: a 20 MB input was tokenized in full
    to be refused): then refused with `context_length_exceeded` before tokenization, or (`truncate`) cut to a
    prefix of twice the bytes the limit can hold, whose first `limit` tokens are the text's own."""
    size = len(text.encode("utf-8", "surrogatepass"))
    per_token = longest * NORMALIZING_SLACK
    at_least = -(-size // per_token)
    if at_least <= limit:
        return text
    if not truncate:
        raise WorkerError(
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            f"{param} has at least {at_least} tokens (its {size} bytes; refused before tokenization), but this "
            f"model takes at most {limit} per input (shorten it, or have it cut: embed_truncate: true in the "
            "model's voltgate config)",
            param=param,
        )
    return text.encode("utf-8", "surrogatepass")[: 2 * limit * per_token].decode("utf-8", "ignore")


class _Handlers:
    """The routes, over the state the lifespan fills in."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.spec = state.spec

    def _engine(self) -> EmbeddingEngine:
        engine = self.state.engine
        if engine is None:
            raise loading()
        return engine

    async def _run(self, engine: EmbeddingEngine, sequences: list[list[int]], receive: Receive) -> Vectors | None:
        try:
            future = engine.submit(sequences)
        except QueueFullError as exc:
            raise WorkerError(ErrorCode.QUEUE_FULL, str(exc)) from exc
        except EngineClosedError as exc:
            raise WorkerError(ErrorCode.WORKER_UNAVAILABLE, str(exc)) from exc
        try:
            return await until_disconnected(future, receive)
        except EngineClosedError as exc:
            raise WorkerError(ErrorCode.WORKER_UNAVAILABLE, str(exc)) from exc

    def _sequences(self, model: EmbeddingModel, body: EngineEmbeddingRequest) -> list[list[int]]:
        """Token sequences of the request's inputs (blocking: tokenizes), each checked against the context."""
        items, many = _input_items(body.input)
        if not items:
            raise invalid("'input' must not be empty", param="input")
        if len(items) > self.spec.max_inputs:
            raise invalid(f"'input' has {len(items)} items; at most {self.spec.max_inputs}", param="input")
        limit = model.max_input_tokens
        sequences: list[list[int]] = []
        for i, item in enumerate(items):
            param = f"input[{i}]" if many else "input"
            if isinstance(item, str):
                tokens = model.tokenize(_bounded(item, model.longest_token, limit, body.truncate, param))
                keep_end = model.end_tokens()
            else:
                bad = next((t for t in item if not 0 <= t < model.n_vocab), None)
                if bad is not None:
                    raise invalid(f"{param}: token {bad} is not in this model's vocabulary "
                                  f"(0..{model.n_vocab - 1}). {FOREIGN_TOKENS_HINT}", param=param)  # fmt: skip
                tokens, keep_end = list(item), 0
            if not tokens:
                raise invalid(f"{param} is empty", param=param)
            if len(tokens) > limit:
                if not body.truncate:
                    raise WorkerError(
                        ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                        f"{param} has {len(tokens)} tokens, but this model takes at most {limit} per input "
                        "(shorten it, or have it cut: truncate: true in the request to this worker, embed_truncate: "
                        "true in the model's voltgate config)",
                        param=param,
                    )
                tokens = tokens[: limit - keep_end] + tokens[len(tokens) - keep_end :]
            sequences.append(tokens)
        return sequences

    async def embeddings(self, request: Request) -> Response:
        try:
            engine = self._engine()
            if self.spec.task != "embed":
                raise WorkerError(
                    ErrorCode.UNSUPPORTED_TASK, f"model {self.spec.model_name!r} is a reranker: use /v1/rerank"
                )
            body = parse_body(await request.body(), EngineEmbeddingRequest, {"input": _INPUT_FORMS})
            model = engine.model
            if body.dimensions is not None:
                if not self.spec.matryoshka:
                    raise invalid(f"model {self.spec.model_name!r} does not support 'dimensions'", param="dimensions")
                if body.dimensions > model.n_out:
                    raise invalid(f"'dimensions' must be at most {model.n_out} for this model", param="dimensions")
            sequences = await asyncio.to_thread(self._sequences, model, body)
            vectors = await self._run(engine, sequences, request.receive)
        except WorkerError as exc:
            return exc.response()
        if vectors is None:
            return client_closed()
        content = await asyncio.to_thread(self._render_embeddings, vectors, body, sum(map(len, sequences)))
        return Response(content, media_type="application/json")

    def _render_embeddings(self, vectors: Vectors, body: EngineEmbeddingRequest, prompt_tokens: int) -> bytes:
        finished = finish_vectors(vectors, dimensions=body.dimensions, normalize=body.normalize)
        return render_embeddings(
            finished, model=self.spec.model_name, encoding_format=body.encoding_format, prompt_tokens=prompt_tokens
        )

    async def rerank(self, request: Request) -> Response:
        try:
            engine = self._engine()
            if self.spec.task != "rerank":
                raise WorkerError(
                    ErrorCode.UNSUPPORTED_TASK, f"model {self.spec.model_name!r} is not a reranker: use /v1/embeddings"
                )
            body = parse_body(await request.body(), EngineRerankRequest)
            if len(body.documents) > self.spec.max_inputs:
                raise invalid(
                    f"'documents' has {len(body.documents)} items; at most {self.spec.max_inputs}", param="documents"
                )
            model = engine.model
            sequences = await asyncio.to_thread(lambda: [model.rerank_tokens(body.query, d) for d in body.documents])
            for i, tokens in enumerate(sequences):
                if len(tokens) > model.max_input_tokens:
                    raise WorkerError(
                        ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                        f"query and documents[{i}] take {len(tokens)} tokens, but this model reads at most "
                        f"{model.max_input_tokens}",
                        param=f"documents[{i}]",
                    )
            vectors = await self._run(engine, sequences, request.receive)
        except WorkerError as exc:
            return exc.response()
        if vectors is None:
            return client_closed()
        n_tokens = sum(map(len, sequences))
        results = rank_results(
            vectors[:, 0].tolist(), body.documents, top_n=body.top_n, return_documents=body.return_documents
        )
        return JSONResponse(
            {
                "model": self.spec.model_name,
                "object": "list",
                "results": results,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }
        )

    async def health(self, _request: Request) -> Response:
        engine = self.state.engine
        if engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        model = engine.model
        return JSONResponse(
            {
                "status": "ok",
                "model": self.spec.model_name,
                "task": self.spec.task,
                "pooling": model.pooling,
                "n_embd": model.n_out,
                "max_input_tokens": model.max_input_tokens,
                "n_batch": model.n_batch,
                "n_seq_max": model.n_seq_max,
                "matryoshka": self.spec.matryoshka,
                **asdict(engine.stats()),
            }
        )

    async def models(self, _request: Request) -> Response:
        if self.state.engine is None:
            return loading().response()
        return model_list(self.spec.model_name, self.state.created)


async def _load(spec: EmbedSpec, state: _State, on_fatal: Callable[[str], None]) -> None:
    """Load the model off the event loop and start its engine; a failure is fatal for the worker."""
    started = time.monotonic()
    try:
        model = await asyncio.to_thread(EmbeddingModel, spec.model_path, spec.options)
    except Exception as exc:
        log.error("loading %s failed: %s", spec.model_path, exc)
        on_fatal(f"loading failed: {exc}")
        return
    try:
        _check_task(spec, model)
    except ValueError as exc:
        model.close()
        log.error("%s", exc)
        on_fatal(str(exc))
        return
    if state.closing:
        model.close()
        return
    engine = EmbeddingEngine(model, max_queue=spec.max_queue, on_fatal=on_fatal)
    engine.start()
    state.engine = engine
    log.info(
        "loaded %s model %s from %s in %.1fs (pooling=%s dim=%d max_input=%d n_batch=%d inputs/pass=%d%s)",
        spec.task, spec.model_name, spec.model_path, time.monotonic() - started, model.pooling, model.n_out,
        model.max_input_tokens, model.n_batch, model.n_seq_max, " matryoshka" if spec.matryoshka else "",
    )  # fmt: skip


def create_app(spec: EmbedSpec, on_fatal: Callable[[str], None]) -> WorkerApp:
    """The embedding worker's ASGI app; the model loads on a thread while /health answers 503."""
    state = _State(spec)
    handlers = _Handlers(state)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state.loop = asyncio.get_running_loop()
        loader = asyncio.create_task(_load(spec, state, on_fatal), name="model-loader")
        try:
            yield
        finally:
            state.closing = True
            await loader  # a load in progress cannot be interrupted: let it finish, then free it
            if state.engine is not None:
                await state.engine.close()
                state.engine = None

    routes = [
        Route("/health", handlers.health, methods=["GET"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/v1/embeddings", handlers.embeddings, methods=["POST"]),
        Route("/v1/rerank", handlers.rerank, methods=["POST"]),
        Route("/v1/reranking", handlers.rerank, methods=["POST"]),
    ]
    return WorkerApp(Starlette(routes=routes, lifespan=lifespan), state.begin_shutdown)
