"""llama.cpp in embedding mode: a pooled-output context, many inputs per forward pass, one engine thread.

`EmbeddingModel` is the native part, blocking like `native.Model` (whose `lib` handle, backend set-up and
`NativeError` it shares; it is the one other module that calls llama.cpp): a GGUF loaded with
`embeddings = true` and the GGUF's pooling (or an override), so llama.cpp returns one vector per sequence
(`llama_get_embeddings_seq`), or with pooling rank one score per sequence from the model's classifier head.
Encoders without a KV cache (BERT, nomic-bert, jina-bert) run through `llama_encode`; decoders (SmolLM2,
Qwen3-Embedding) through `llama_decode`, their KV cache cleared before every pass. Every pass holds whole
sequences (never one split across passes or micro-batches: with non-causal attention llama.cpp requires
it, and mean pooling over a split sequence would be wrong).

`EmbeddingEngine` puts the model behind the event loop: requests arriving together are queued, and each
round takes whole requests until it has enough inputs for a full pass, runs them on the one engine thread
(packed into as few passes as `n_batch` tokens and `n_seq_max` sequences allow), and hands each request
its rows back.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from backends.llamacpp.worker.native import Batch, NativeError, lib, load_model, token_piece
from backends.llamacpp.worker.native import tokenize as native_tokenize
from backends.llamacpp.worker.prompt_bound import longest_token_bytes

log = logging.getLogger("voltgate.worker")

Pooling = Literal["mean", "cls", "last", "rank"]
POOLINGS: tuple[Pooling, ...] = ("mean", "cls", "last", "rank")
_POOLING_IDS: dict[Pooling, int] = {"mean": 1, "cls": 2, "last": 3, "rank": 4}  # enum llama_pooling_type
_POOLING_BY_ID: dict[int, Pooling] = {v: k for k, v in _POOLING_IDS.items()}

Vectors = npt.NDArray[np.float32]

_CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}  # ggml_type (ggml.h), as in native.py


@dataclass(frozen=True)
class EmbeddingOptions:
    """How the embedding context is created.

    `max_input_tokens` is the longest input accepted (capped at the model's trained context); `n_batch` the
    tokens of one forward pass (at least `max_input_tokens`: a pass always holds whole inputs), shared by at
    most `n_seq_max` inputs. `pooling` None keeps the GGUF's pooling type. `cache_type` is a decoder's KV
    cache: bf16 keeps CPU results batch-invariant (f16 and f32 do not once a pass holds a few dozen tokens).
    """

    max_input_tokens: int
    n_seq_max: int
    n_batch: int = 2048
    n_threads: int | None = None
    n_gpu_layers: int = 0
    flash_attn: bool = True
    pooling: Pooling | None = None
    cache_type: str = "bf16"


def plan_passes(lengths: Sequence[int], *, max_tokens: int, max_seqs: int) -> list[range]:
    """Split inputs (in order) into forward passes of at most `max_tokens` tokens and `max_seqs` inputs.

    Each range indexes `lengths`; every input fits alone (`0 < length <= max_tokens`, checked).
    """
    passes: list[range] = []
    start = tokens = 0
    for i, n in enumerate(lengths):
        if not 0 < n <= max_tokens:
            raise ValueError(f"input {i} has {n} tokens; a pass holds 1 to {max_tokens}")
        if i > start and (tokens + n > max_tokens or i - start == max_seqs):
            passes.append(range(start, i))
            start, tokens = i, 0
        tokens += n
    if len(lengths) > start:
        passes.append(range(start, len(lengths)))
    return passes


def finish_vectors(vectors: Vectors, *, dimensions: int | None, normalize: bool) -> Vectors:
    """Keep the first `dimensions` components (matryoshka), then scale each row to unit L2 norm if `normalize`.

    A zero row stays zero. Returns a new float32 array; `vectors` is not modified.
    """
    out = np.array(vectors[:, :dimensions] if dimensions is not None else vectors, dtype=np.float32)
    if normalize:
        norms = np.linalg.norm(out.astype(np.float64), axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
    return out


class _PassBatch(Batch):
    """`native.Batch` filled with whole sequences at once (sequence i is seq_id i), every token an output:
    a pooled-embedding context needs them all, and says so in its log on every pass otherwise."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._logits[:] = 1

    def fill(self, sequences: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        n = int(lengths.sum())
        if n > self.capacity or not n:
            raise NativeError(f"a pass holds 1 to {self.capacity} tokens, not {n}")
        self._token[:n] = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences])
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        self._pos[:n] = np.arange(n) - starts  # 0, 1, ... within each sequence
        self._seq_id[:n] = np.repeat(np.arange(len(sequences), dtype=np.int32), lengths)
        self.n_tokens = n
        self.raw.n_tokens = n


class EmbeddingModel:
    """A GGUF loaded for pooled embeddings (or rerank scores), with its one context.

    Blocking native code: call `forward`/`embed`/`close` from the engine thread only. `tokenize` and
    `rerank_tokens` only read the vocabulary and may run on any thread.
    """

    pooling: Pooling
    n_out: int  # floats per input: the embedding size, or the classifier's outputs with pooling rank
    n_batch: int  # tokens per pass
    n_seq_max: int  # inputs per pass
    max_input_tokens: int
    n_vocab: int
    causal: bool
    _memory: Any
    _encode: bool
    _batch: _PassBatch

    def __init__(self, path: Path, options: EmbeddingOptions) -> None:
        self._model = load_model(path, n_gpu_layers=options.n_gpu_layers)
        self._ctx = None
        try:
            self._init_context(options)
        except BaseException:
            self.close()
            raise

    def _init_context(self, options: EmbeddingOptions) -> None:
        self._vocab = lib.llama_model_get_vocab(self._model)
        max_seqs = int(lib.llama_max_parallel_sequences())
        if options.n_seq_max > max_seqs:
            raise NativeError(f"{options.n_seq_max} sequences per pass > llama.cpp's maximum of {max_seqs}")
        n_ctx_train = int(lib.llama_model_n_ctx_train(self._model))
        max_input = options.max_input_tokens
        if 0 < n_ctx_train < max_input:
            log.warning("inputs capped at the model's trained context of %d tokens (asked %d)", n_ctx_train, max_input)
            max_input = n_ctx_train
        n_batch = max(options.n_batch, max_input)

        cparams = lib.llama_context_default_params()
        cparams.embeddings = True
        cparams.pooling_type = (
            lib.LLAMA_POOLING_TYPE_UNSPECIFIED if options.pooling is None else _POOLING_IDS[options.pooling]
        )
        # One pass = one micro-batch: non-causal attention needs every token of a pass in one ubatch.
        cparams.n_ctx = n_batch
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = options.n_seq_max
        # A decoder's KV cache: one pool of n_batch cells that any sequence of a pass may use.
        cparams.kv_unified = True
        if options.n_threads is not None:
            cparams.n_threads = options.n_threads
            cparams.n_threads_batch = options.n_threads
        cparams.flash_attn_type = (
            lib.LLAMA_FLASH_ATTN_TYPE_AUTO if options.flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.no_perf = True
        cparams.type_k = cparams.type_v = _CACHE_TYPES[options.cache_type]
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise NativeError("failed to create the llama.cpp embedding context (out of memory?)")

        pooling = _POOLING_BY_ID.get(int(lib.llama_pooling_type(self._ctx)))
        if pooling is None:  # LLAMA_POOLING_TYPE_NONE: one vector per token, nothing per input
            raise NativeError(
                "the GGUF declares no pooling type, so llama.cpp gives no vector per input: "
                "pass --pooling mean, cls or last (last suits decoder embedding models)"
            )
        self.pooling = pooling
        n_out = lib.llama_model_n_cls_out if pooling == "rank" else lib.llama_model_n_embd_out
        self.n_out = int(n_out(self._model))
        # llama.cpp may lower n_batch (causal models: to n_ctx); a pass is what both limits allow.
        self.n_batch = min(int(lib.llama_n_batch(self._ctx)), int(lib.llama_n_ubatch(self._ctx)))
        self.n_seq_max = options.n_seq_max
        self.max_input_tokens = min(max_input, self.n_batch)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.causal = bool(lib.llama_get_causal_attn(self._ctx))
        self._memory = lib.llama_get_memory(self._ctx)
        # Without a KV cache (BERT-like encoders) llama_decode only forwards to llama_encode, with a warning.
        self._encode = not self._memory
        self._batch = _PassBatch(n_batch)

    def close(self) -> None:
        if self._ctx:
            lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lib.llama_model_free(self._model)
            self._model = None

    # --- vocabulary (any thread) ------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Tokens of `text`; with `add_special` the model's own framing (BERT: [CLS] ... [SEP])."""
        return native_tokenize(self._vocab, text, add_special=add_special, parse_special=parse_special)

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token renders to (special tokens as their text with `special`)."""
        return token_piece(self._vocab, token, special=special)

    @functools.cached_property
    def longest_token(self) -> int:
        """The most bytes one token renders to: the divisor of an input's byte bound (`prompt_bound`)."""
        return longest_token_bytes(self)

    def rerank_tokens(self, query: str, document: str) -> list[int]:
        """One (query, document) pair as a reranker reads it, framed like llama.cpp's server does.

        A GGUF with a "rerank" chat template (Qwen3-Reranker) gets that template with `{query}` and
        `{document}` filled in; otherwise `[BOS] query [EOS] [SEP] document [EOS]`, each special token only
        where the vocabulary adds it (BERT: `[CLS] q [SEP] d`, XLM-R/bge-reranker: `<s> q </s></s> d </s>`).
        """
        template = lib.llama_model_chat_template(self._model, b"rerank")
        if template:
            prompt = template.decode("utf-8").replace("{query}", query).replace("{document}", document)
            return self.tokenize(prompt, add_special=False, parse_special=True)
        eos = int(lib.llama_vocab_eos(self._vocab))
        if eos < 0:
            eos = int(lib.llama_vocab_sep(self._vocab))
        add_eos = bool(lib.llama_vocab_get_add_eos(self._vocab)) and eos >= 0
        tokens: list[int] = []
        if lib.llama_vocab_get_add_bos(self._vocab):
            tokens.append(int(lib.llama_vocab_bos(self._vocab)))
        tokens += self.tokenize(query, add_special=False, parse_special=False)
        if add_eos:
            tokens.append(eos)
        if lib.llama_vocab_get_add_sep(self._vocab):
            tokens.append(int(lib.llama_vocab_sep(self._vocab)))
        tokens += self.tokenize(document, add_special=False, parse_special=False)
        if add_eos:
            tokens.append(eos)
        return tokens

    def end_tokens(self) -> int:
        """How many special tokens the tokenizer appends to an input (kept when an input is truncated)."""
        return 1 if lib.llama_vocab_get_add_sep(self._vocab) or lib.llama_vocab_get_add_eos(self._vocab) else 0

    # --- forward passes (engine thread) -----------------------------------------------------------

    def forward(self, sequences: Sequence[Sequence[int]]) -> Vectors:
        """One forward pass over whole sequences; row i is sequence i's pooled vector (rank: its scores)."""
        batch = self._batch
        batch.fill(sequences)
        if self._memory:
            lib.llama_memory_clear(self._memory, True)
        run = lib.llama_encode if self._encode else lib.llama_decode
        rc = int(run(self._ctx, batch.raw))
        if rc != 0:
            raise NativeError(f"llama.cpp failed with status {rc} on {len(sequences)} inputs, {batch.n_tokens} tokens")
        out = np.empty((len(sequences), self.n_out), dtype=np.float32)
        for seq_id in range(len(sequences)):
            ptr = lib.llama_get_embeddings_seq(self._ctx, seq_id)
            if not ptr:
                raise NativeError(f"llama.cpp returned no pooled output for sequence {seq_id}")
            out[seq_id] = np.ctypeslib.as_array(ptr, shape=(self.n_out,))
        return out

    def embed(self, sequences: Sequence[Sequence[int]]) -> Vectors:
        """Pooled outputs of any number of sequences, packed into as few passes as the limits allow."""
        passes = plan_passes([len(s) for s in sequences], max_tokens=self.n_batch, max_seqs=self.n_seq_max)
        if not passes:
            return np.empty((0, self.n_out), dtype=np.float32)
        return np.concatenate([self.forward([sequences[i] for i in p]) for p in passes])


class QueueFullError(Exception):
    """Too many requests are waiting for the engine."""


class EngineClosedError(Exception):
    """The engine is shutting down (or failed) and takes no more work."""


@dataclass(frozen=True)
class EngineStats:
    queue_depth: int
    busy: bool
    requests_total: int
    inputs_total: int
    tokens_total: int
    rounds_total: int


@dataclass
class _Job:
    sequences: Sequence[Sequence[int]]
    future: asyncio.Future[Vectors]


class EmbeddingEngine:
    """An `EmbeddingModel` behind the event loop, batching concurrent requests.

    Concurrency contract: `start`, `submit`, `stats`, `shutdown` and `close` are called on the event loop's
    thread; native code runs only on the engine's single thread, one round at a time, so the loop never
    blocks on llama.cpp. A round takes queued requests whole, in arrival order, until it holds
    `round_inputs` inputs (at least one request). A request whose future was cancelled before its round
    starts is skipped. A native failure fails that round's requests and everything queued, closes the
    engine and calls `on_fatal` (the model's state is then unknown).
    """

    def __init__(
        self,
        model: EmbeddingModel,
        *,
        max_queue: int,
        round_inputs: int | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.model = model
        self._max_queue = max_queue
        self._round_inputs = round_inputs or model.n_seq_max
        self._on_fatal = on_fatal
        self._pending: collections.deque[_Job] = collections.deque()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-engine")
        self._closed = False
        self._busy = False
        self._requests = self._inputs = self._tokens = self._rounds = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the drain task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="embedding-drain")

    def submit(self, sequences: Sequence[Sequence[int]]) -> asyncio.Future[Vectors]:
        """Queue one request's token sequences; the future resolves to its rows, in order."""
        if self._closed:
            raise EngineClosedError("the worker is shutting down")
        if len(self._pending) >= self._max_queue:
            raise QueueFullError(f"{len(self._pending)} requests are already waiting")
        future: asyncio.Future[Vectors] = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(sequences, future))
        self._wake.set()
        return future

    def stats(self) -> EngineStats:
        return EngineStats(
            queue_depth=len(self._pending),
            busy=self._busy,
            requests_total=self._requests,
            inputs_total=self._inputs,
            tokens_total=self._tokens,
            rounds_total=self._rounds,
        )

    def _take(self) -> list[_Job]:
        jobs: list[_Job] = []
        inputs = 0
        while self._pending and (not jobs or inputs + len(self._pending[0].sequences) <= self._round_inputs):
            job = self._pending.popleft()
            if job.future.done():  # cancelled while it waited
                continue
            jobs.append(job)
            inputs += len(job.sequences)
        return jobs

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            while self._pending and not self._closed:
                jobs = self._take()
                if not jobs:
                    continue
                sequences = [s for job in jobs for s in job.sequences]
                self._busy = True
                try:
                    vectors = await loop.run_in_executor(self._executor, self.model.embed, sequences)
                except Exception as exc:
                    log.error("embedding pass failed: %s", exc)
                    for job in jobs:
                        if not job.future.done():
                            job.future.set_exception(EngineClosedError(f"the engine failed: {exc}"))
                    self.shutdown("the engine failed")
                    if self._on_fatal is not None:
                        self._on_fatal(f"embedding pass failed: {exc}")
                    return
                finally:
                    self._busy = False
                self._rounds += 1
                self._requests += len(jobs)
                self._inputs += len(sequences)
                self._tokens += sum(len(s) for s in sequences)
                offset = 0
                for job in jobs:
                    n = len(job.sequences)
                    if not job.future.done():
                        job.future.set_result(vectors[offset : offset + n])
                    offset += n

    def shutdown(self, reason: str = "the worker is shutting down") -> None:
        """Refuse new work and fail every queued request now; a round in flight still delivers."""
        self._closed = True
        while self._pending:
            job = self._pending.popleft()
            if not job.future.done():
                job.future.set_exception(EngineClosedError(reason))
        self._wake.set()

    async def close(self) -> None:
        """`shutdown`, wait for the round in flight, then free the model on the engine thread."""
        self.shutdown()
        if self._task is not None:
            await self._task
        await asyncio.get_running_loop().run_in_executor(self._executor, self.model.close)
        self._executor.shutdown(wait=True)
