"""Images into a llama.cpp sequence: llama.cpp's multimodal library (mtmd) behind a small typed API.

A vision model here is a text GGUF plus its `mmproj` GGUF (the image encoder and projector). The flow, for
one prompt in one sequence of the worker's shared context:

    projector = VisionProjector.load(mmproj_path, text_model)         # once, beside the text model
    with projector.tokenize(prompt_text, images) as prompt:            # one media marker per image
        for chunk in prompt.chunks:
            TextChunk  -> its tokens go through the worker's batched prefill like any prompt tokens
            ImageChunk -> projector.eval_image(chunk, context, seq_id=..., n_past=...) encodes the image
                          and decodes its embeddings into that sequence, alone (an embeddings batch cannot
                          share a llama_batch with token batches), then prefill goes on at the new n_past

`eval_image` goes through mtmd's helper, which also sets what some families need while their image is
decoded (non-causal attention for Gemma 3, M-RoPE positions for Qwen-VL, where an image advances the
position by `n_pos`, not `n_tokens`). `eval_prompt` evaluates a whole prompt in one call: the reference
path the tests compare the worker's chunked path against.

Everything here is blocking native code: call it from the engine thread only, like `native`.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import llama_cpp as _llama_cpp
from PIL import Image

from backends.llamacpp.worker import native

# As in `native`: the bindings' annotations are partial; keep them untyped and every call in this module.
lib: Any = _llama_cpp
# A llama-cpp-python built without tools/mtmd has no libmtmd: the worker still serves text, and only loading
# a projector fails (VisionError naming the cause). The GPU recipe's build is one such (bench/results/
# 2026-12-05-gpu-regress-partial).
mtmd: Any
MTMD_MISSING: str | None = None
try:
    from llama_cpp import mtmd_cpp as mtmd
except (ImportError, OSError) as e:  # FileNotFoundError (an OSError) when the shared library is absent
    mtmd, MTMD_MISSING = None, f"this llama-cpp-python has no multimodal library (libmtmd): {e}"

log = logging.getLogger("voltgate.worker")

_LOG_WARN, _LOG_ERROR, _LOG_CONT = 3, 4, 5


class VisionError(native.NativeError):
    """The multimodal library refused to load a projector, tokenize a prompt or evaluate an image."""


@dataclass(frozen=True)
class RgbImage:
    """Decoded pixels, 8-bit RGB, row-major (`width * height * 3` bytes): what the encoder takes."""

    width: int
    height: int
    pixels: bytes

    @classmethod
    def from_encoded(cls, data: bytes) -> RgbImage:
        """Decode an image the gateway has already validated (gateway/serving/images.py): its first frame, as RGB.

        Pillow, not mtmd's stb_image, so every format the gateway accepts (WebP included) decodes here.
        """
        with Image.open(io.BytesIO(data)) as image:
            image.seek(0)
            rgb = image.convert("RGB")
            return cls(rgb.width, rgb.height, rgb.tobytes())

    @property
    def digest(self) -> str:
        """A content hash: mtmd's id for the image's chunk, so equal images can be recognised in a cache."""
        h = hashlib.sha256(f"{self.width}x{self.height}:".encode())
        h.update(self.pixels)
        return h.hexdigest()


@dataclass(frozen=True)
class TextChunk:
    """Prompt tokens between images: prefilled like any other prompt tokens."""

    tokens: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_pos(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class ImageChunk:
    """One image's place in the prompt: `n_tokens` embeddings that advance the position by `n_pos`."""

    index: int  # the chunk's index in its prompt
    n_tokens: int
    n_pos: int
    image_id: str
    handle: Any  # const mtmd_input_chunk *, owned by the MultimodalPrompt


PromptChunk = TextChunk | ImageChunk


class MultimodalPrompt:
    """A tokenized prompt with images: its chunks, in order. Owns native memory: close it (or use `with`)."""

    def __init__(self, handle: Any, chunks: Sequence[PromptChunk]) -> None:
        self._handle = handle
        self.chunks: tuple[PromptChunk, ...] = tuple(chunks)

    @property
    def n_tokens(self) -> int:
        """Every token the prompt puts into the KV cache: text tokens plus each image's embeddings."""
        return sum(c.n_tokens for c in self.chunks)

    @property
    def n_pos(self) -> int:
        """How far the prompt advances the sequence's position (differs from `n_tokens` with M-RoPE)."""
        return sum(c.n_pos for c in self.chunks)

    @property
    def image_tokens(self) -> int:
        return sum(c.n_tokens for c in self.chunks if isinstance(c, ImageChunk))

    def close(self) -> None:
        if self._handle:
            mtmd.mtmd_input_chunks_free(self._handle)
            self._handle = None

    def __enter__(self) -> MultimodalPrompt:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:  # a request's prompt lives as long as its sequences: freed with them
        self.close()

    @property
    def raw(self) -> Any:
        return self._handle


def cache_tokens(prompt: MultimodalPrompt) -> list[int]:
    """The prompt as a slot's cached token list: text tokens as they are, each image token a negative id.

    All tokens of one image get the same id, taken from the image's digest, so a cached prefix compares
    equal only where the same image sits at the same place (negative: never a vocabulary id). Cut a
    reused prefix with `reusable_prefix`, never inside an image.
    """
    out: list[int] = []
    for chunk in prompt.chunks:
        if isinstance(chunk, TextChunk):
            out.extend(chunk.tokens)
        else:
            out.extend([-1 - int(chunk.image_id[:12] or "0", 16)] * chunk.n_tokens)
    return out


def reusable_prefix(prompt: MultimodalPrompt, n_common: int) -> int:
    """The longest prefix of at most `n_common` tokens that ends between chunks or inside a text chunk.

    An image's embeddings are decoded whole: a cached prefix that ends inside an image is cut back to the
    image's start, and the image is evaluated again.
    """
    start = 0
    for chunk in prompt.chunks:
        end = start + chunk.n_tokens
        if n_common < end:
            return start if isinstance(chunk, ImageChunk) else n_common
        start = end
    return min(n_common, start)


_log_forwarder: native.LogForwarder | None = None


def _route_logs() -> None:
    global _log_forwarder
    if _log_forwarder is None:
        _log_forwarder = native.LogForwarder("mtmd")  # mtmd's and clip's warnings; the per-image chatter dropped
        mtmd.mtmd_log_set(_log_forwarder.callback, ctypes.c_void_p(0))
        mtmd.mtmd_helper_log_set(_log_forwarder.callback, ctypes.c_void_p(0))


def mmproj_beside(model_path: Path) -> Path | None:
    """The projector found beside a GGUF, as llama.cpp's tools name it: `mmproj*.gguf` in the same folder.

    One match is the answer; none or several is None (several is ambiguous: the config must name one).
    """
    found = sorted(p for p in model_path.parent.glob("mmproj*.gguf") if p != model_path)
    return found[0] if len(found) == 1 else None


class VisionProjector:
    """A loaded `mmproj` for one loaded text model (an mtmd context). Engine thread only."""

    def __init__(self, handle: Any, path: Path) -> None:
        self._ctx = handle
        self.path = path
        self.marker: str = mtmd.mtmd_default_marker().decode("utf-8")
        """The text that stands for one image in a prompt passed to `tokenize`."""
        self.uses_mrope = bool(mtmd.mtmd_decode_use_mrope(handle))

    @classmethod
    def load(cls, mmproj_path: Path, text_model: Any, *, n_threads: int = 2, use_gpu: bool = False) -> VisionProjector:
        """Load the projector at `mmproj_path` for `text_model` (a llama_model pointer).

        Raises VisionError when the file is no projector, has no vision encoder, or its output width is not
        the text model's embedding width (mtmd checks it: the wrong mmproj for this model).
        """
        if MTMD_MISSING:
            raise VisionError(MTMD_MISSING)
        native.init_backend()
        _route_logs()
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        params.warmup = False  # the first image pays for the graph; loading stays quick
        handle = mtmd.mtmd_init_from_file(str(mmproj_path).encode(), text_model, params)
        if not handle:
            raise VisionError(f"failed to load the multimodal projector {mmproj_path} for this model")
        if not mtmd.mtmd_support_vision(handle):
            mtmd.mtmd_free(handle)
            raise VisionError(f"{mmproj_path} has no vision encoder")
        return cls(handle, mmproj_path)

    def close(self) -> None:
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def tokenize(self, text: str, images: Sequence[RgbImage], *, add_special: bool = True) -> MultimodalPrompt:
        """Split `text` at each `self.marker` and put the next image there, as chunks.

        `text` must hold exactly one marker per image. The text parts are tokenized with special tokens
        parsed (the chat template's); `add_special` adds the model's BOS where it wants one.
        """
        if text.count(self.marker) != len(images):
            raise VisionError(f"the prompt has {text.count(self.marker)} image markers for {len(images)} images")
        bitmaps = [self._bitmap(image) for image in images]
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            data = text.encode("utf-8")
            inp = mtmd.mtmd_input_text()
            inp.text, inp.text_len, inp.add_special, inp.parse_special = data, len(data), add_special, True
            array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            rc = int(mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), array, len(bitmaps)))
            if rc != 0:
                mtmd.mtmd_input_chunks_free(chunks)
                raise VisionError(f"mtmd could not tokenize the prompt (status {rc}: 2 means an image failed)")
            return MultimodalPrompt(chunks, list(self._chunks(chunks)))
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, image: RgbImage) -> Any:
        if len(image.pixels) != image.width * image.height * 3:
            raise VisionError(f"{len(image.pixels)} bytes are no {image.width}x{image.height} RGB image")
        buf = (ctypes.c_uint8 * len(image.pixels)).from_buffer_copy(image.pixels)
        bitmap = mtmd.mtmd_bitmap_init(image.width, image.height, buf)
        if not bitmap:
            raise VisionError("mtmd could not take the image")
        mtmd.mtmd_bitmap_set_id(bitmap, image.digest.encode())
        return bitmap

    def _chunks(self, chunks: Any) -> Iterator[PromptChunk]:
        for i in range(int(mtmd.mtmd_input_chunks_size(chunks))):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = int(mtmd.mtmd_input_chunk_get_type(chunk))
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                yield TextChunk(tuple(ptr[j] for j in range(n.value)) if n.value else ())
            elif kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raw_id = mtmd.mtmd_input_chunk_get_id(chunk)
                yield ImageChunk(
                    index=i,
                    n_tokens=int(mtmd.mtmd_input_chunk_get_n_tokens(chunk)),
                    n_pos=int(mtmd.mtmd_input_chunk_get_n_pos(chunk)),
                    image_id=raw_id.decode() if raw_id else "",
                    handle=chunk,
                )
            else:
                raise VisionError(f"the prompt holds a chunk of type {kind}: only text and images are served")

    def eval_image(self, chunk: ImageChunk, context: Any, *, seq_id: int, n_past: int, n_batch: int) -> int:
        """Encode the image and decode its embeddings into `seq_id` at `n_past`; returns the new n_past.

        `context` is the llama_context the text model decodes in. The decode holds the context alone:
        no token batch of other sequences may run in the same `llama_decode`.
        """
        new_n_past = lib.llama_pos(0)
        rc = int(
            mtmd.mtmd_helper_eval_chunk_single(
                self._ctx, context, chunk.handle, n_past, seq_id, n_batch, False, ctypes.byref(new_n_past)
            )
        )
        if rc != 0:
            raise VisionError(f"evaluating image chunk {chunk.index} failed with status {rc}")
        return int(new_n_past.value)

    def eval_prompt(self, prompt: MultimodalPrompt, context: Any, *, seq_id: int, n_past: int, n_batch: int) -> int:
        """Evaluate every chunk into `seq_id` from `n_past`, logits for the last token; returns the new n_past."""
        new_n_past = lib.llama_pos(0)
        rc = int(
            mtmd.mtmd_helper_eval_chunks(
                self._ctx, context, prompt.raw, n_past, seq_id, n_batch, True, ctypes.byref(new_n_past)
            )
        )
        if rc != 0:
            raise VisionError(f"evaluating the prompt failed with status {rc}")
        return int(new_n_past.value)
