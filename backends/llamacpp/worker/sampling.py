"""Per-request sampling settings, as the engine's sampler chains consume them."""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# llama.cpp's default repetition window (`--repeat-last-n`).
PENALTY_LAST_N = 64

# OpenAI's logit_bias range; at the bottom of it a token is banned outright.
LOGIT_BIAS_MAX = 100.0

# JSON for `response_format={"type": "json_object"}`: an object at the root, as OpenAI's JSON mode
# promises. Unlike llama_cpp.llama_grammar.JSON_GBNF, whitespace between tokens is at most one space or
# one newline plus a short indent, so a small model cannot run away in whitespace until max_tokens.
JSON_OBJECT_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4})
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ ]{0,8}
"""


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence picks its next token.

    `temperature == 0` means greedy. `seed` is always concrete by the time a request reaches the engine
    (the server draws one when the client gave none), so a sequence's randomness never depends on
    which other sequences share the batch. `logit_bias` holds (token id, bias in [-100, 100]) pairs, added
    to the logits before anything else in the chain (see `logit_biases`).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    grammar: str | None = None
    grammar_triggers: tuple[str, ...] = ()
    """With triggers the grammar is lazy: free text until a trigger pattern (a regex over all the text so
    far, applied from its first capture group) matches, then held to the grammar (tool_choice "auto")."""
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no state (no penalties, no grammar): the next token is a pure function of the logits,
        so `greedy_token` can pick it without a llama.cpp sampler chain."""
        return self.greedy and not self.penalized and self.grammar is None and not self.logit_bias


def logit_biases(params: SamplingParams, eog_ids: Iterable[int] = ()) -> dict[int, float]:
    """What the chain's logit-bias sampler adds, by token: the request's biases and `ignore_eos`'s bans.

    A bias of -100 bans its token (-inf), as OpenAI documents it; +100 is added as is, which makes its
    token the pick unless another token is also raised by about as much (logits span far less than 100).
    A token named twice keeps its last bias. `ignore_eos` bans every end-of-generation token whatever
    its bias.
    """
    biases = {token: -np.inf if bias <= -LOGIT_BIAS_MAX else bias for token, bias in params.logit_bias}
    if params.ignore_eos:
        biases.update(dict.fromkeys(eog_ids, -np.inf))
    return {token: float(bias) for token, bias in biases.items() if bias != 0.0}


def greedy_token(logits: npt.NDArray[np.float32], banned: Set[int] = frozenset()) -> int:
    """The token llama.cpp's greedy sampler picks from one row of logits: the first of the maxima.

    `banned` tokens are treated as -inf, as the -inf logit bias of `ignore_eos` makes them. When the plain
    argmax is not banned it is also the masked argmax (masking only lowers values), so the row is copied
    only in the rare case that a banned token came first.
    """
    token = int(logits.argmax())
    if token not in banned:
        return token
    masked = logits.copy()
    masked[np.fromiter(banned, dtype=np.int64, count=len(banned))] = -np.inf
    return int(masked.argmax())
