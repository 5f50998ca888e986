"""Per-request sampling settings, as the engine's sampler chains consume them."""

from __future__ import annotations

from dataclasses import dataclass

# llama.cpp's default repetition window (`--repeat-last-n`).
PENALTY_LAST_N = 64

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
    which other sequences share the batch.
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
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
