"""Images reach the model: backends/llamacpp/worker/vision.py on the real llama.cpp multimodal library (mtmd).

The model is the embedded SmolLM2-135M with a tiny random-weight LLaVA-1.5 image encoder written by
tests/fixtures/vlm/build.py (16 image tokens per image). Random weights say nothing about meaning, so these
tests check that the image is in the sequence: the prompt grows by the image's tokens, different pictures
give different next-token logits, the same picture gives the same ones, and the worker's chunked path (text
through an ordinary token batch, the image decoded alone) gives what mtmd's one-call reference path gives.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from backends.llamacpp.worker import native
from backends.llamacpp.worker.vision import (
    ImageChunk,
    RgbImage,
    TextChunk,
    VisionError,
    VisionProjector,
    cache_tokens,
    mmproj_beside,
    reusable_prefix,
)
from tests.conftest import REPO, free_port
from tests.fixtures.vlm.build import TinyClipSpec, vlm_dir, write_tiny_mmproj

pytestmark = pytest.mark.integration

SPEC = TinyClipSpec()
N_CTX = 256


def _prompt(marker: str, question: str = "What is in this picture?") -> str:
    return f"<|im_start|>user\n{marker}{question}<|im_end|>\n<|im_start|>assistant\n"


def _picture(colour: tuple[int, int, int], size: tuple[int, int] = (48, 36), stripe: bool = False) -> RgbImage:
    image = Image.new("RGB", size, colour)
    if stripe:
        for x in range(size[0]):
            image.putpixel((x, size[1] // 2), (255, 255, 255))
    return RgbImage(image.width, image.height, image.tobytes())


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mmproj(tmp_path_factory.mktemp("vlm") / "mmproj-tiny-llava.gguf", SPEC)


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[native.Model]:
    loaded = native.Model(smollm2_path, native.ContextOptions(n_ctx_per_seq=N_CTX, n_seq_max=2, n_threads=2))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def projector(model: native.Model, mmproj: Path) -> Iterator[VisionProjector]:
    loaded = VisionProjector.load(mmproj, model.raw_model)
    yield loaded
    loaded.close()


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """What the worker's slot choice computes (kept here: the worker modules are moving)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _last_logits(model: native.Model) -> np.ndarray:
    return model.logits(1)[-1].copy()


def _reference_logits(model: native.Model, projector: VisionProjector, image: RgbImage, seq_id: int = 0) -> np.ndarray:
    model.seq_clear(seq_id)
    with projector.tokenize(_prompt(projector.marker), [image]) as prompt:
        n_past = projector.eval_prompt(prompt, model.context, seq_id=seq_id, n_past=0, n_batch=512)
        assert n_past == prompt.n_pos
    return _last_logits(model)


def test_the_fixture_is_small_and_the_same_on_every_build(tmp_path: Path, mmproj: Path) -> None:
    again = write_tiny_mmproj(tmp_path / "again.gguf", SPEC)
    assert again.read_bytes() == mmproj.read_bytes()
    assert mmproj.stat().st_size < 2 * 1024 * 1024


def test_an_image_adds_its_tokens_to_the_prompt(model: native.Model, projector: VisionProjector) -> None:
    text_only = model.tokenize(_prompt(""), add_special=True)
    with projector.tokenize(_prompt(projector.marker), [_picture((200, 20, 20))]) as prompt:
        images = [c for c in prompt.chunks if isinstance(c, ImageChunk)]
        assert len(images) == 1
        assert images[0].n_tokens == SPEC.image_tokens == 16
        assert prompt.image_tokens == SPEC.image_tokens
        assert prompt.n_tokens == len(text_only) + SPEC.image_tokens
        text = [t for c in prompt.chunks if isinstance(c, TextChunk) for t in c.tokens]
        assert text == text_only  # the text around the image is tokenized as without it


def test_two_images_add_twice_the_tokens(projector: VisionProjector) -> None:
    one, two = _picture((10, 200, 10)), _picture((10, 10, 200))
    with projector.tokenize(_prompt(projector.marker * 2), [one, two]) as prompt:
        ids = [c.image_id for c in prompt.chunks if isinstance(c, ImageChunk)]
        assert prompt.image_tokens == 2 * SPEC.image_tokens
        assert ids == [one.digest, two.digest] and ids[0] != ids[1]


def test_different_images_give_different_logits_and_the_same_image_the_same(
    model: native.Model, projector: VisionProjector
) -> None:
    red = _reference_logits(model, projector, _picture((220, 30, 30)))
    blue = _reference_logits(model, projector, _picture((30, 30, 220)))
    red_again = _reference_logits(model, projector, _picture((220, 30, 30)))
    striped = _reference_logits(model, projector, _picture((220, 30, 30), stripe=True))
    np.testing.assert_allclose(red, red_again, rtol=0, atol=1e-4)
    assert np.abs(red - blue).max() > 1e-2
    assert np.abs(red - striped).max() > 1e-3  # one row of pixels is seen too


def test_the_image_changes_what_the_text_model_sees(model: native.Model, projector: VisionProjector) -> None:
    with_image = _reference_logits(model, projector, _picture((120, 120, 120)))
    model.seq_clear(0)
    tokens = model.tokenize(_prompt(""), add_special=True)
    batch = native.Batch(len(tokens))
    batch.add_run(tokens, 0, 0, logits=True)
    model.decode(batch)
    assert np.abs(_last_logits(model) - with_image).max() > 1e-2


def test_the_workers_chunked_path_matches_the_reference(model: native.Model, projector: VisionProjector) -> None:
    """Text chunks through the worker's own token batches, the image alone through `eval_image`, in seq 1."""
    image = _picture((40, 160, 90), stripe=True)
    reference = _reference_logits(model, projector, image, seq_id=0)
    model.seq_clear(1)
    n_past = 0
    with projector.tokenize(_prompt(projector.marker), [image]) as prompt:
        last = len(prompt.chunks) - 1
        for i, chunk in enumerate(prompt.chunks):
            if isinstance(chunk, ImageChunk):
                n_past = projector.eval_image(chunk, model.context, seq_id=1, n_past=n_past, n_batch=512)
            else:
                batch = native.Batch(chunk.n_tokens)
                batch.add_run(chunk.tokens, n_past, 1, logits=i == last)
                model.decode(batch)
                n_past += chunk.n_tokens
        assert n_past == prompt.n_pos
    np.testing.assert_allclose(_last_logits(model), reference, rtol=0, atol=1e-3)


def test_a_text_sequence_beside_an_image_sequence_is_unchanged(model: native.Model, projector: VisionProjector) -> None:
    """A text-only request keeps its answer while another sequence of the same context holds an image."""
    tokens = model.tokenize(_prompt("", "Name a colour."), add_special=True)

    def text_logits() -> np.ndarray:
        model.seq_clear(1)
        batch = native.Batch(len(tokens))
        batch.add_run(tokens, 0, 1, logits=True)
        model.decode(batch)
        return _last_logits(model)

    model.seq_clear(0)
    alone = text_logits()
    _reference_logits(model, projector, _picture((250, 250, 0)), seq_id=0)  # seq 0 now holds an image
    np.testing.assert_allclose(text_logits(), alone, rtol=0, atol=1e-3)


def test_a_marker_count_that_does_not_match_the_images_is_refused(projector: VisionProjector) -> None:
    with pytest.raises(VisionError, match="2 image markers for 1 images"):
        projector.tokenize(_prompt(projector.marker * 2), [_picture((1, 2, 3))])


def test_pixels_that_are_no_rgb_image_are_refused(projector: VisionProjector) -> None:
    with pytest.raises(VisionError, match="no 4x4 RGB image"):
        projector.tokenize(_prompt(projector.marker), [RgbImage(4, 4, b"\0" * 10)])


def test_a_projector_for_another_width_is_refused(model: native.Model, tmp_path: Path) -> None:
    wrong = write_tiny_mmproj(tmp_path / "mmproj-wrong.gguf", TinyClipSpec(text_embd=64))
    with pytest.raises(VisionError, match="failed to load the multimodal projector"):
        VisionProjector.load(wrong, model.raw_model)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_every_accepted_format_decodes_to_rgb(fmt: str, projector: VisionProjector) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (20, 10), (0, 128, 255)).save(buf, format=fmt)
    image = RgbImage.from_encoded(buf.getvalue())
    assert (image.width, image.height, len(image.pixels)) == (20, 10, 600)
    with projector.tokenize(_prompt(projector.marker), [image]) as prompt:
        assert prompt.image_tokens == SPEC.image_tokens


def test_the_mmproj_beside_a_gguf_is_found(tmp_path: Path) -> None:
    model_path = tmp_path / "model-Q4_K_M.gguf"
    model_path.write_bytes(b"")
    assert mmproj_beside(model_path) is None
    (tmp_path / "mmproj-model-f16.gguf").write_bytes(b"")
    assert mmproj_beside(model_path) == tmp_path / "mmproj-model-f16.gguf"
    (tmp_path / "mmproj-model-f32.gguf").write_bytes(b"")
    assert mmproj_beside(model_path) is None  # two candidates: the config must name one


@pytest.mark.parametrize("size", [(1, 1), (1000, 2), (2, 1000)])
def test_extreme_shapes_are_encoded_without_trouble(
    model: native.Model, projector: VisionProjector, size: tuple[int, int]
) -> None:
    logits = _reference_logits(model, projector, _picture((90, 90, 90), size=size))
    assert np.isfinite(logits).all()


def test_a_cached_prefix_matches_only_the_same_image_and_is_never_cut_inside_one(
    projector: VisionProjector,
) -> None:
    red, blue = _picture((250, 0, 0)), _picture((0, 0, 250))
    with (
        projector.tokenize(_prompt(projector.marker, "Describe it."), [red]) as a,
        projector.tokenize(_prompt(projector.marker, "What colour?"), [red]) as same_image,
        projector.tokenize(_prompt(projector.marker, "Describe it."), [blue]) as other_image,
    ):
        first_text = a.chunks[0].n_tokens
        end_of_image = first_text + SPEC.image_tokens
        assert all(t < 0 for t in cache_tokens(a)[first_text:end_of_image])
        shared = common_prefix_len(cache_tokens(a), cache_tokens(same_image))
        assert shared == end_of_image  # the same image is shared; the questions differ right after it
        assert reusable_prefix(same_image, shared) == shared
        differ = common_prefix_len(cache_tokens(a), cache_tokens(other_image))
        assert differ == first_text  # another image: only the text before it
        assert reusable_prefix(a, first_text + 5) == first_text  # inside the image: back to its start
        assert reusable_prefix(a, 10_000) == a.n_tokens


def test_the_pair_is_laid_out_once_with_the_mmproj_beside_the_model(tmp_path: Path, smollm2_path: Path) -> None:
    directory = vlm_dir(tmp_path / "vlm", smollm2_path)
    model_path = directory / smollm2_path.name
    found = mmproj_beside(model_path)
    assert model_path.resolve() == smollm2_path.resolve() and found is not None
    stamp = found.stat().st_mtime_ns
    assert vlm_dir(tmp_path / "vlm", smollm2_path) == directory and found.stat().st_mtime_ns == stamp
    vlm_dir(tmp_path / "vlm", smollm2_path, TinyClipSpec(n_layer=2))  # another spec replaces it
    replaced = mmproj_beside(model_path)
    assert replaced is not None and replaced != found and not found.exists()


def test_a_worker_given_the_wrong_mmproj_fails_its_start_with_mtmds_reason(smollm2_path: Path, tmp_path: Path) -> None:
    """`--mmproj` for another model: the worker exits non-zero and says why, the supervisor's fatal pattern."""
    wrong = write_tiny_mmproj(tmp_path / "mmproj-wrong.gguf", TinyClipSpec(text_embd=64))
    argv = [
        sys.executable, "-m", "backends.llamacpp.worker", "--model", str(smollm2_path), "--model-name", "m",
        "--port", str(free_port()), "--ctx", "256", "--slots", "1", "--n-threads", "1", "--mmproj", str(wrong),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=120, check=False)
    assert done.returncode == 1
    assert b"failed to load the multimodal projector" in done.stderr
