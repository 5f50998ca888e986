"""The module that touches llama.cpp's ctypes API (`sampler` uses its `lib`): model/context, batches, KV memory.

Everything here is blocking native code. Apart from `Model.tokenize`/`Model.piece` (read-only use of the
vocabulary), call it only from the engine thread.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as _llama_cpp
import numpy as np
import numpy.typing as npt

from backends.llamacpp import cpu_features
from backends.llamacpp.worker.prompt_tokens import Special

# The bindings' annotations are partial and partly wrong (ctypes pointers, c_char_p); treat them as
# untyped here and keep every call in this module (and `sampler`, which uses this `lib`).
lib: Any = _llama_cpp

log = logging.getLogger("voltgate.worker")

_LOG_WARN = 3
_LOG_ERROR = 4
_LOG_CONT = 5  # ggml_log_level (ggml.h): DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5

_PARSED_ATTRS = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_USER_DEFINED | lib.LLAMA_TOKEN_ATTR_UNKNOWN

# ggml_type values for the KV cache (ggml.h).
_CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


class NativeError(Exception):
    """llama.cpp refused to load, decode or sample."""

    client_error = False  # True where the request asked for what cannot be served (a 400, not a 500)


@dataclass(frozen=True)
class ContextOptions:
    """How the llama.cpp context is created: one KV cache shared by `n_seq_max` sequences."""

    n_ctx_per_seq: int
    n_seq_max: int
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = 0
    flash_attn: bool = True
    kv_unified: bool = False
    cache_type: str = "f16"
    n_cpu_moe: int = 0  # a MoE's routed experts of the first N layers in host memory; -1: every layer


class LogForwarder:
    """Sends a native library's warnings and errors to our logger, one line each, under `prefix`; drops the
    chatter (llama.cpp's here, mtmd's and clip's in `vision`)."""

    def __init__(self, prefix: str = "llama.cpp") -> None:
        self._prefix = prefix
        self._line = ""
        self._level = 0
        self.callback = lib.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes, _user_data: Any) -> None:
        if level != _LOG_CONT:
            self._level = level
        if self._level not in (_LOG_WARN, _LOG_ERROR):
            return
        self._line += text.decode("utf-8", "replace")
        while "\n" in self._line:
            line, self._line = self._line.split("\n", 1)
            if line.strip():
                log.warning("%s: %s", self._prefix, line.strip())


_log_forwarder: LogForwarder | None = None


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its log through ours."""
    global _log_forwarder
    if _log_forwarder is None:
        _log_forwarder = LogForwarder()
        lib.llama_log_set(_log_forwarder.callback, ctypes.c_void_p(0))
        lib.llama_backend_init()


def system_info() -> str:
    """llama.cpp's one-line summary of the build: `CPU : SSE3 = 1 | ... | AMX_INT8 = 1 | ...`."""
    init_backend()
    return bytes(lib.llama_print_system_info()).decode("utf-8", "replace").strip()


def extra_bufts_decision(setting: cpu_features.ExtraBufts | None = None) -> cpu_features.ExtraBuftsDecision:
    """Whether weights may go to llama.cpp's extra buffer types (AMX, repack) on this host and build."""
    chosen = cpu_features.configured_setting() if setting is None else setting
    flags = cpu_features.host_cpu_flags()
    return cpu_features.decide_extra_bufts(flags, cpu_features.build_features(system_info()), chosen)


def load_model(
    path: Path, *, n_gpu_layers: int, decision: cpu_features.ExtraBuftsDecision | None = None, n_cpu_moe: int = 0
) -> Any:
    """`llama_model_load_from_file` with the host's safe buffer setting; every worker loads through here.
    `n_cpu_moe`: keep the routed experts of the first N layers (-1: all) in host memory (`expert_overrides`)."""
    init_backend()
    decision = decision or extra_bufts_decision()
    if not decision.use_extra_bufts:
        log.info("llama.cpp extra buffer types off: %s", decision.reason)
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    mparams.use_extra_bufts = decision.use_extra_bufts
    overrides = expert_overrides(n_cpu_moe)  # kept alive until the load returns: llama.cpp reads it meanwhile
    if overrides is not None:
        mparams.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    model = lib.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise NativeError(f"failed to load model from {path}")
    return model


def token_piece(vocab: Any, token: int, *, special: bool) -> bytes:
    """The bytes `token` renders to in `vocab` (special tokens as their text only with `special`)."""
    buf = ctypes.create_string_buffer(64)
    n = int(lib.llama_token_to_piece(vocab, token, buf, 64, 0, special))
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = int(lib.llama_token_to_piece(vocab, token, buf, -n, 0, special))
    return buf.raw[: max(n, 0)]


def tokenize(vocab: Any, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
    data = text.encode("utf-8")
    capacity = len(data) + 8
    buf = (lib.llama_token * capacity)()
    n = int(lib.llama_tokenize(vocab, data, len(data), buf, capacity, add_special, parse_special))
    if n < 0:
        capacity = -n
        buf = (lib.llama_token * capacity)()
        n = int(lib.llama_tokenize(vocab, data, len(data), buf, capacity, add_special, parse_special))
    if n < 0:
        raise NativeError("tokenization failed")
    return list(buf[:n])


def vocab_specials(vocab: Any) -> dict[int, Special]:
    """The tokens llama.cpp's tokenizer finds in text by itself, by id: control, user-defined and unknown
    ones (llama-vocab.cpp's `cache_special_tokens`), as the vocabulary writes them."""
    found: dict[int, Special] = {}
    for token in range(int(lib.llama_vocab_n_tokens(vocab))):
        attr = int(lib.llama_vocab_get_attr(vocab, token))
        if attr & _PARSED_ATTRS:
            text = lib.llama_vocab_get_text(vocab, token) or b""
            found[token] = Special(text.decode("utf-8", "replace"), bool(attr & lib.LLAMA_TOKEN_ATTR_LSTRIP))
    return found


def vocab_cuttable(vocab: Any) -> bool:
    """Whether a text cut before a special token tokenizes as its parts do (`prompt_tokens`): SPM and BPE
    vocabularies that append no end-of-sequence token."""
    kind = int(lib.llama_vocab_type(vocab))
    return kind in (lib.LLAMA_VOCAB_TYPE_SPM, lib.LLAMA_VOCAB_TYPE_BPE) and not lib.llama_vocab_get_add_eos(vocab)


def load_vocab(path: Path) -> Any:
    """A GGUF's vocabulary alone (no weights; free it with `lib.llama_model_free`): for checks and benchmarks."""
    init_backend()
    mparams = lib.llama_model_default_params()
    mparams.vocab_only = True
    model = lib.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise NativeError(f"failed to load the vocabulary of {path}")
    return model


class _BuftOverride(ctypes.Structure):
    """llama.h's `llama_model_tensor_buft_override`: tensors whose name matches `pattern` go to `buft`."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


EXPERT_TENSORS = r"\.ffn_(up|down|gate)_(ch|)exps"
"""The routed experts' weight names after `blk.N` (llama.cpp's `LLM_FFN_EXPS_REGEX`, what `--n-cpu-moe` moves)."""


def expert_overrides(n_cpu_moe: int) -> ctypes.Array[_BuftOverride] | None:
    """The override list (ended by a null entry) that puts the routed experts of layers 0..n-1 (every layer for
    -1) in the CPU's buffer type, as llama.cpp's `--n-cpu-moe N` (`--cpu-moe` for all); None for 0."""
    if n_cpu_moe == 0:
        return None
    patterns = [EXPERT_TENSORS] if n_cpu_moe < 0 else [rf"blk\.{i}{EXPERT_TENSORS}" for i in range(n_cpu_moe)]
    cpu = _ggml_cpu()
    cpu.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    buft = cpu.ggml_backend_cpu_buffer_type()
    entries = [_BuftOverride(p.encode(), buft) for p in patterns] + [_BuftOverride(None, None)]
    return (_BuftOverride * len(entries))(*entries)


def _ggml_cpu() -> ctypes.CDLL:
    """The libggml-cpu libllama was loaded with (the CPU backend it was built with): from `LLAMA_CPP_LIB_PATH`
    when set (llama-cpp-python then loads every library from there: a build of one's own), else the package's."""
    folder = cpu_features.llama_lib_dir() or Path(_llama_cpp.__file__).parent / "lib"
    found = sorted(folder.glob("libggml-cpu*.so*"))
    if not found:
        raise NativeError(
            f"no libggml-cpu in {folder} (the llama.cpp libraries loaded): experts cannot be kept in host memory"
        )
    return ctypes.CDLL(str(found[0]))


class Model:
    """A loaded GGUF model and its one context (one KV cache, `n_seq_max` sequences)."""

    def __init__(self, path: Path, options: ContextOptions) -> None:
        self._model = load_model(path, n_gpu_layers=options.n_gpu_layers, n_cpu_moe=options.n_cpu_moe)
        self._vocab = lib.llama_model_get_vocab(self._model)

        max_seqs = int(lib.llama_max_parallel_sequences())
        if options.n_seq_max > max_seqs:
            raise NativeError(f"slots {options.n_seq_max} > llama.cpp's maximum of {max_seqs} sequences")
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = options.n_ctx_per_seq * options.n_seq_max
        cparams.n_batch = options.n_batch
        cparams.n_ubatch = options.n_batch
        cparams.n_seq_max = options.n_seq_max
        cparams.kv_unified = options.kv_unified
        if options.n_threads is not None:
            cparams.n_threads = options.n_threads
            cparams.n_threads_batch = options.n_threads
        cparams.flash_attn_type = (
            lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if options.flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.no_perf = True
        cache_type = _CACHE_TYPES[options.cache_type]
        cparams.type_k = cache_type
        cparams.type_v = cache_type
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise NativeError("failed to create the llama.cpp context (out of memory?)")
        self._memory = lib.llama_get_memory(self._ctx)
        self.n_ctx_seq = int(lib.llama_n_ctx_seq(self._ctx))
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self._vocab))
        self.bos_id = int(lib.llama_vocab_bos(self._vocab))
        self.eos_id = int(lib.llama_vocab_eos(self._vocab))
        # A recurrent (Mamba, gated delta net) or hybrid model's sequence cannot be cut at any position
        # (`seq_remove` fails inside its recurrent state): `checkpoints` serve its prefix reuse.
        self.recurrent = bool(lib.llama_model_is_recurrent(self._model) or lib.llama_model_is_hybrid(self._model))
        self._pieces: dict[int, bytes] = {}
        self._logits_views: dict[tuple[int, int], npt.NDArray[np.float32]] = {}
        # A set, not a ctypes call per generated token (each native call also hands the GIL away).
        self.eog_ids = frozenset(t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self._vocab, t))

    def close(self) -> None:
        if self._ctx:
            lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lib.llama_model_free(self._model)
            self._model = None

    # --- vocabulary -------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        return tokenize(self._vocab, text, add_special=add_special, parse_special=parse_special)

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (special tokens render empty unless `special`)."""
        if not special and token in self._pieces:
            return self._pieces[token]
        data = token_piece(self._vocab, token, special=special)
        if not special:
            self._pieces[token] = data
        return data

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    def chat_template(self, name: str | None = None) -> str | None:
        """The GGUF's chat template (`tokenizer.chat_template`), or a named one such as "tool_use"."""
        raw = lib.llama_model_chat_template(self._model, name.encode() if name else None)
        return raw.decode("utf-8") if raw else None

    def special_text(self, token: int) -> str:
        return "" if token < 0 else self.piece(token, special=True).decode("utf-8", "replace")

    def specials(self) -> dict[int, Special]:
        return vocab_specials(self._vocab)

    @property
    def cuttable(self) -> bool:
        return vocab_cuttable(self._vocab)

    # --- KV memory --------------------------------------------------------------------------------

    def seq_remove(self, seq_id: int, start: int) -> bool:
        """Drop positions >= `start` of a sequence; False if llama.cpp cannot cut it there."""
        return bool(lib.llama_memory_seq_rm(self._memory, seq_id, start, -1))

    def seq_clear(self, seq_id: int) -> None:
        lib.llama_memory_seq_rm(self._memory, seq_id, -1, -1)

    def seq_copy(self, src: int, dst: int) -> None:
        """Make `dst` hold exactly what `src` holds now (every position); `dst`'s own KV is dropped.

        With one KV stream per sequence (non-unified KV), llama.cpp can only copy a whole stream (a partial
        range aborts the process), and it does so at the start of the next `decode`, before that decode
        writes anything: so `src` may take part in that decode, and a later `seq_remove` on `dst` applies
        to the copy. With unified KV the cells are shared, not copied.
        """
        lib.llama_memory_seq_rm(self._memory, dst, -1, -1)
        lib.llama_memory_seq_cp(self._memory, src, dst, -1, -1)

    def seq_state_size(self, seq_id: int) -> int:
        """Bytes of one sequence's state (its KV cells), as `seq_state_save` would copy them."""
        return int(lib.llama_state_seq_get_size(self._ctx, seq_id))

    def seq_state_save(self, seq_id: int, size: int) -> bytearray | None:
        """A copy of one sequence's state in host memory (`size` from `seq_state_size`); None on failure."""
        state = bytearray(size)
        written = int(lib.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(state), size, seq_id))
        if written <= 0:
            return None
        return state if written == size else state[:written]

    def seq_state_restore(self, seq_id: int, state: bytearray) -> bool:
        """Load a `seq_state_save` copy into an empty sequence; False when llama.cpp refuses it (no room)."""
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        return int(lib.llama_state_seq_set_data(self._ctx, buffer, len(state), seq_id)) > 0

    def seq_partial_save(self, seq_id: int) -> bytearray | None:
        """A copy of the part of a sequence's state that cannot be cut back (a recurrent model's state;
        `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`: not the attention KV); None on failure. `checkpoints` only."""
        flags = lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(lib.llama_state_seq_get_size_ext(self._ctx, seq_id, flags))
        state = bytearray(size)
        buffer = (ctypes.c_uint8 * size).from_buffer(state)
        written = int(lib.llama_state_seq_get_data_ext(self._ctx, buffer, size, seq_id, flags)) if size > 0 else 0
        return None if written <= 0 else state if written == size else state[:written]

    def seq_partial_restore(self, seq_id: int, state: bytearray) -> bool:
        """Load a `seq_partial_save` copy over the sequence's recurrent state (its attention KV stays)."""
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        flags = lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        return int(lib.llama_state_seq_set_data_ext(self._ctx, buffer, len(state), seq_id, flags)) > 0

    # --- decoding ---------------------------------------------------------------------------------

    def decode(self, batch: Batch) -> None:
        rc = int(lib.llama_decode(self._ctx, batch.raw))
        if rc != 0:
            raise NativeError(f"llama_decode failed with status {rc} for {batch.n_tokens} tokens")

    def logits(self, n_outputs: int) -> npt.NDArray[np.float32]:
        """The last decode's logits, one row per batch token that asked for them, in batch order.

        A view of llama.cpp's buffer, fetched with one native call: valid until the next `decode`.
        """
        address = ctypes.cast(lib.llama_get_logits(self._ctx), ctypes.c_void_p).value
        if not address:
            raise NativeError("the last decode produced no logits")
        key = (address, n_outputs)
        rows = self._logits_views.get(key)
        if rows is None:  # llama.cpp keeps its output buffer between decodes: so do we, the views of it
            ptr = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            rows = np.ctypeslib.as_array(ptr, shape=(n_outputs, self.n_vocab))
            if len(self._logits_views) > 256:
                self._logits_views.clear()
            self._logits_views[key] = rows
        return rows

    @property
    def context(self) -> Any:
        return self._ctx

    @property
    def raw_model(self) -> Any:
        """The llama_model pointer (what the multimodal projector is loaded for)."""
        return self._model

    @property
    def vocab(self) -> Any:
        return self._vocab


class Batch:
    """A reusable llama_batch of up to `capacity` tokens, each in exactly one sequence.

    The arrays are ours (not `llama_batch_init`'s), so a run of tokens is written with one slice
    assignment per field instead of one ctypes item access per token and field.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.n_tokens = 0
        self.n_outputs = 0
        self._token = np.zeros(capacity, dtype=np.int32)
        self._pos = np.zeros(capacity, dtype=np.int32)
        self._n_seq_id = np.ones(capacity, dtype=np.int32)
        self._seq_id = np.zeros(capacity, dtype=np.int32)
        self._logits = np.zeros(capacity, dtype=np.int8)
        int_p = ctypes.POINTER(ctypes.c_int32)
        base = self._seq_id.ctypes.data
        self._seq_id_rows = (int_p * capacity)(*(ctypes.cast(base + 4 * i, int_p) for i in range(capacity)))
        self.raw = lib.llama_batch()
        self.raw.n_tokens = 0
        self.raw.token = self._token.ctypes.data_as(int_p)
        self.raw.pos = self._pos.ctypes.data_as(int_p)
        self.raw.n_seq_id = self._n_seq_id.ctypes.data_as(int_p)
        self.raw.seq_id = ctypes.cast(self._seq_id_rows, ctypes.POINTER(int_p))
        self.raw.logits = self._logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def clear(self) -> None:
        # Stale entries past n_tokens are never read: add_run writes every field of every token it adds.
        self.n_tokens = 0
        self.n_outputs = 0
        self.raw.n_tokens = 0

    def add_run(self, tokens: Sequence[int], start_pos: int, seq_id: int, *, logits: bool) -> int:
        """Append consecutive tokens of one sequence; `logits` asks for the last one's.

        Returns the last token's batch index (what `Sampler.sample` takes); with `logits`, its row in
        `Model.logits` is `n_outputs - 1` right after this call.
        """
        n = len(tokens)
        i = self.n_tokens
        j = i + n
        if j > self.capacity or n == 0:
            raise NativeError(f"cannot add {n} tokens to a batch holding {i} of {self.capacity}")
        if n == 1:  # a decode step's usual run: item assignment is cheaper than converting a sequence
            self._token[i] = tokens[0]
            self._pos[i] = start_pos
            self._seq_id[i] = seq_id
        else:
            self._token[i:j] = tokens
            self._pos[i:j] = np.arange(start_pos, start_pos + n, dtype=np.int32)
            self._seq_id[i:j] = seq_id
            self._logits[i : j - 1] = 0
        self._logits[j - 1] = logits
        self.n_tokens = j
        self.raw.n_tokens = j
        if logits:
            self.n_outputs += 1
        return j - 1
