"""The scheduler's image step: images next in prefilling sequences' prompts, evaluated on the engine thread.

A prompt with images (`GenerationRequest.images`) is prefilled chunk by chunk: its text runs go through the
step's token batch like any prompt tokens (`Scheduler._plan` stops a run at the next image), and when a
sequence's next position is an image, the engine thread evaluates it before the step's batch (the
`ImageEvaluator`: mtmd encodes the image and decodes its embeddings into the sequence in a `llama_decode`
of its own, since an embeddings batch cannot share one with token batches). Requests without images never
reach the evaluator and batch as before. Engine thread only, like the slots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from backends.llamacpp.worker.slots import SeqState
from backends.llamacpp.worker.tickets import ImageSpan

if TYPE_CHECKING:
    from backends.llamacpp.worker.native import Model

log = logging.getLogger("voltgate.worker")

ImageEvaluator = Callable[[ImageSpan, int, int], int]
"""Evaluates an image into a sequence: (image, seq_id, n_past) -> the new n_past; raises NativeError."""


class ImageError(Exception):
    """An image could not be evaluated into its sequence (the sequence fails, the engine goes on)."""


def eval_images(
    running: Sequence[SeqState], evaluate: ImageEvaluator | None, model: Model, before_first: Callable[[], None]
) -> tuple[int, list[tuple[SeqState, str]]]:
    """Evaluate every image that is next in a prefilling sequence's prompt, calling `before_first` once
    before the first. Returns the image tokens decoded and the sequences that failed (their KV cleared),
    with why, for the scheduler to release."""
    decoded = 0
    failed: list[tuple[SeqState, str]] = []
    for seq in [s for s in running if s.request.images]:
        while seq.prefilling and (image := seq.request.image_at(len(seq.slot.cached))) is not None:
            if not decoded and not failed:
                before_first()
            try:
                _eval(image, seq, evaluate)
            except Exception as exc:  # NativeError from mtmd, or ImageError: this sequence only
                log.error("request %s: image at %d failed: %s", seq.request.request_id, image.start, exc)
                model.seq_clear(seq.slot.seq_id)
                seq.slot.cached.clear()
                failed.append((seq, f"evaluating the image failed: {exc}"))
                break
            seq.slot.cached.extend(seq.request.prompt[image.start : image.end])
            decoded += image.n_tokens
    return decoded, failed


def _eval(image: ImageSpan, seq: SeqState, evaluate: ImageEvaluator | None) -> None:
    if evaluate is None:
        raise ImageError("this worker has no multimodal projector (mmproj)")
    n_past = evaluate(image, seq.slot.seq_id, image.start)
    if n_past != image.end:
        raise ImageError(f"the image advanced the position to {n_past}, not {image.end}")
