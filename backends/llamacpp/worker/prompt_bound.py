"""A prompt refused by its length in bytes, before a token is made (issue 35: a 20 MB prompt was tokenized
in full, 10.5 M tokens in 4.5-14 s, only to be refused as over the context).

The bound: a token stands for at most `longest` bytes of text, the longest piece any token of the vocabulary
renders to (special tokens as their text: `<|im_start|>`, parsed as one token, is 12 bytes). The prompt the
model reads holds every byte of the request's texts (the chat template only adds to them) and llama.cpp's BPE
and SentencePiece tokenizers do not normalize text, so a prompt of `b` text bytes is at least
`ceil(b / longest)` tokens. When that alone exceeds the context, the request can never be served and is
refused at once, in OpenAI's `context_length_exceeded` words with that lower bound as the count; any prompt
that passes is at most about `context * longest` bytes, which bounds what tokenization can cost. Image
markers are not counted (an image's tokens are counted by the projector, never as text).
"""

from __future__ import annotations

from typing import Protocol

from backends.errors import ErrorCode
from backends.llamacpp.worker.httpkit import WorkerError
from backends.overflow import overflow_message
from backends.request import IMAGE_MARKER, EngineRequest


class Vocabulary(Protocol):
    n_vocab: int

    def piece(self, token: int, *, special: bool = False) -> bytes: ...


def longest_token_bytes(vocab: Vocabulary) -> int:
    """The most bytes one token renders to (at least 1): the bound's divisor (49,152 tokens: ~50 ms)."""
    return max((len(vocab.piece(token, special=True)) for token in range(vocab.n_vocab)), default=1) or 1


def text_bytes(request: EngineRequest) -> int:
    """The UTF-8 bytes of the texts the prompt will hold: message contents and tool-call arguments, or the
    completion prompt (image markers left out)."""
    texts: list[str] = []
    if request.prompt is not None:
        texts.append(request.prompt)
    for message in request.messages or ():
        texts.append(message.content or "")
        texts.extend(call.function.arguments for call in message.tool_calls or ())
    marker = len(IMAGE_MARKER.encode())
    return sum(len(text.encode("utf-8", "surrogatepass")) - text.count(IMAGE_MARKER) * marker for text in texts)


def check_prompt_bytes(request: EngineRequest, longest: int, context: int) -> None:
    """Refuse (400 `context_length_exceeded`) a request whose texts alone are more tokens than `context`."""
    size = text_bytes(request)
    at_least = -(-size // longest)
    if at_least >= context:
        field = "messages" if request.messages is not None else "prompt"
        message = overflow_message(context, at_least, field=field) + (
            f" (at least: its {size} bytes over {longest}, the most bytes one token holds; refused before tokenization)"
        )
        raise WorkerError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, message, param=field)
