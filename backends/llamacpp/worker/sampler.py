"""One sequence's llama.cpp sampler: its chain (logit bias, penalties, top-k/p, min-p, temperature, the pick)
and, apart from it, its grammar.

A grammar is checked after the pick, as llama-server does (`common_sampler_sample`, "grammar-based rejection
sampling"): the chain picks from the full logits; if the grammar allows that one token the pick stands,
checked in one step against one token instead of the whole vocabulary; only if it does not, the grammar
masks every candidate and the chain picks again. For greedy decoding the token is the one the grammar-first
chain would pick (the best allowed token); sampled, the pick is the chain's when allowed and else the
grammar-masked chain's (llama-server's trade as well). What this saves: applying a grammar checks each of
the vocabulary's tokens against every live stack of the grammar, a few milliseconds a token for JSON mode
and seconds for a 20,000-value enum (issue 35), while a model that follows its schema mostly picks an
allowed token.

Why samplers are not cached by grammar: llama.cpp's `llama_sampler_clone` of a grammar re-points every stack
element at the copied rules by a search over all rule elements, quadratic in the grammar: on SmolLM2's
vocabulary a 5,000-value enum's grammar (128 KB) builds in 19 ms and clones in 165 ms (2,000 values:
3 ms and 27 ms). Building afresh is cheaper; the schema's GBNF text is what is cached (`tools.grammar`).

Blocking native code: `sample` reads the context's logits (engine thread, or the sampling pool after
`Model.logits` synchronized them); `sample_row` reads only the row it is given (any thread).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from backends.llamacpp.worker.native import Model, NativeError, lib
from backends.llamacpp.worker.sampling import PENALTY_LAST_N, SamplingParams, logit_biases

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class Sampler:
    """One sequence's sampler chain and grammar; it owns its RNG, grammar and penalty state."""

    def __init__(self, model: Model, params: SamplingParams) -> None:
        self._chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        self._grammar: Any = None
        self._keep: list[Any] = []
        self._n_vocab = model.n_vocab
        try:
            self._add_bias(model, params)
            if params.grammar is not None:
                self._grammar = self._new_grammar(model, params)
            self._add_chain(params)
        except NativeError:
            self.close()
            raise

    def _add_bias(self, model: Model, params: SamplingParams) -> None:
        biases = logit_biases(params, model.eog_ids)
        if not biases:
            return
        outside = [token for token in biases if not 0 <= token < model.n_vocab]
        if outside:
            raise NativeError(f"logit_bias names token {outside[0]}, outside the vocabulary of {model.n_vocab}")
        entries = (lib.llama_logit_bias * len(biases))()
        for i, (token, bias) in enumerate(sorted(biases.items())):
            entries[i].token = token
            entries[i].bias = bias
        self._keep.append(entries)
        self._add(lib.llama_sampler_init_logit_bias(model.n_vocab, len(biases), entries))

    def _new_grammar(self, model: Model, params: SamplingParams) -> Any:
        text = (params.grammar or "").encode()
        if not params.grammar_triggers:
            grammar = lib.llama_sampler_init_grammar(model.vocab, text, b"root")
        else:
            patterns = (ctypes.c_char_p * len(params.grammar_triggers))(*(p.encode() for p in params.grammar_triggers))
            self._keep.append(patterns)
            grammar = lib.llama_sampler_init_grammar_lazy_patterns(
                model.vocab, text, b"root", patterns, len(params.grammar_triggers), None, 0
            )
        if not grammar:
            raise NativeError("invalid grammar")
        return grammar

    def _add_chain(self, params: SamplingParams) -> None:
        if params.penalized:
            penalties = lib.llama_sampler_init_penalties(
                self._n_vocab,
                PENALTY_LAST_N,
                params.repetition_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
            self._add(penalties)
        if params.greedy:
            self._add(lib.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            self._add(lib.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            self._add(lib.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            self._add(lib.llama_sampler_init_min_p(params.min_p, 1))
        self._add(lib.llama_sampler_init_temp(params.temperature))
        self._add(lib.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))

    def _add(self, sampler: Any) -> None:
        lib.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, model: Model, index: int) -> int:
        """Pick (and accept) the next token from the logits at batch `index` of the last decode."""
        if self._grammar is None:
            return int(lib.llama_sampler_sample(self._chain, model.context, index))
        address = ctypes.cast(lib.llama_get_logits_ith(model.context, index), ctypes.c_void_p).value
        if not address:
            raise NativeError(f"no logits at batch index {index}")
        row = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), shape=(self._n_vocab,))
        return self.sample_row(row)

    def sample_row(self, logits: npt.NDArray[np.float32]) -> int:
        """What `sample` does (the chain's pick, checked against the grammar, accepted), on one logits row:
        no context is read, so it may run on another thread while the engine decodes (`slow_lane`)."""
        token = self._pick(logits, masked=False)
        if self._grammar is not None and not self._allows(token):
            token = self._pick(logits, masked=True)
        self.accept(token)
        return token

    def _pick(self, logits: npt.NDArray[np.float32], *, masked: bool) -> int:
        n = int(logits.shape[0])
        data = np.empty(n, dtype=_TOKEN_DATA)
        data["id"] = np.arange(n, dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        pointer = data.ctypes.data_as(ctypes.POINTER(lib.llama_token_data))
        candidates = lib.llama_token_data_array(pointer, n, -1, False)
        if masked:
            lib.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        lib.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        if not 0 <= candidates.selected < candidates.size:
            raise NativeError("the sampler chain selected no token")
        chosen = candidates.data[candidates.selected]
        if masked and math.isinf(chosen.logit) and chosen.logit < 0:
            raise NativeError("the grammar allows no token here")
        return int(chosen.id)

    def _allows(self, token: int) -> bool:
        one = (lib.llama_token_data * 1)()
        one[0].id, one[0].logit, one[0].p = token, 1.0, 0.0
        array = lib.llama_token_data_array(one, 1, -1, False)
        lib.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return not math.isinf(one[0].logit)

    def accept(self, token: int) -> None:
        """Advance the grammar and the chain's state (penalties) by `token`, picked or forced."""
        if self._grammar is not None:
            lib.llama_sampler_accept(self._grammar, token)
        lib.llama_sampler_accept(self._chain, token)

    def close(self) -> None:
        if self._chain is not None:
            lib.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            lib.llama_sampler_free(self._grammar)
            self._grammar = None
