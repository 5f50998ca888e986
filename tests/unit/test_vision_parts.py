"""gateway/serving/vision_parts.py, config's `mmproj` and the llama.cpp adapter's vision wiring (no network, no
engine)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp.adapter import LlamaCppAdapter
from backends.request import IMAGE_MARKER
from gateway.config import Config, ImageLimits, mmproj_path
from gateway.errors import GatewayError
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.requests import ChatCompletionRequest
from gateway.serving.vision_parts import ImageIntake


def _png(colour: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _request(*urls: str, text: str = "what?") -> ChatCompletionRequest:
    content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    content.append({"type": "text", "text": text})
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages})


async def _images(parsed: ChatCompletionRequest, *, vision: bool = True, **limits: Any) -> Any:
    return await ImageIntake(ImageLimits(**limits)).engine_images(parsed, model="m", vision=vision)


async def test_images_become_engine_images_in_the_order_of_their_markers() -> None:
    red, blue = _png((255, 0, 0)), _png((0, 0, 255))
    parsed = _request(red, blue)
    images = await _images(parsed)
    assert [image.data_uri() for image in images] == [red, blue]
    assert images[0].digest != images[1].digest
    engine = parsed.to_engine(EngineTarget(model="m", images=images))
    assert engine.messages is not None and engine.messages[1].content == f"{IMAGE_MARKER}{IMAGE_MARKER}what?"
    assert engine.wire()["images"][0]["media_type"] == "image/png"


async def test_a_model_without_vision_refuses_the_first_image_by_name_before_reading_it() -> None:
    with pytest.raises(GatewayError) as caught:
        await _images(_request("data:image/png;base64,not-even-base64"), vision=False)
    assert "'m'" in caught.value.message and "vision" in caught.value.message
    assert caught.value.param == "messages[1].content[0].image_url"


async def test_a_text_request_needs_no_vision() -> None:
    assert await _images(_request(), vision=False) == ()


async def test_remote_urls_are_refused_by_default_and_other_schemes_always() -> None:
    with pytest.raises(GatewayError) as caught:
        await _images(_request("https://img.example.com/cat.png"))
    assert "data URI" in caught.value.message and caught.value.status == 400
    with pytest.raises(GatewayError) as caught:
        await _images(_request("file:///etc/passwd"))
    assert caught.value.status == 400


async def test_the_count_limit_names_the_part_past_it() -> None:
    with pytest.raises(GatewayError) as caught:
        await _images(_request(_png((1, 2, 3)), _png((4, 5, 6))), max_images=1)
    assert caught.value.param == "messages[1].content[1].image_url"


def test_mmproj_comes_from_the_key_or_from_beside_the_gguf(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")
    assert mmproj_path(None, gguf, tmp_path) is None
    beside = tmp_path / "model-mmproj-f16.gguf"
    beside.write_bytes(b"")
    assert mmproj_path(None, gguf, tmp_path) == beside
    assert mmproj_path(False, gguf, tmp_path) is None
    assert mmproj_path("other/proj.gguf", gguf, Path("/cfg")) == Path("/cfg/other/proj.gguf")
    (tmp_path / "mmproj-second.gguf").write_bytes(b"")
    assert mmproj_path(None, gguf, tmp_path) is None  # two candidates: the config must name one


def test_the_config_has_images_and_a_body_limit_above_them() -> None:
    config = Config.model_validate({"models": [{"name": "m", "sources": [{"gguf": "/m.gguf"}], "mmproj": False}]})
    assert config.images.remote.allow_hosts == ()
    assert config.server.max_body_bytes > config.images.max_total_bytes


def test_the_adapter_passes_the_mmproj_and_says_vision_only_with_one() -> None:
    adapter = LlamaCppAdapter()
    plain = DeploymentPlan(model="m", engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"), model_format="gguf",
                           context_tokens=512)  # fmt: skip
    with_proj = plain.model_copy(update={"mmproj": Path("/mmproj.gguf")})
    assert not adapter.capabilities(plain).vision and "--mmproj" not in adapter.launch_spec(plain, 1).argv
    assert adapter.capabilities(with_proj).vision and adapter.capabilities(with_proj).public()["vision"]
    argv = adapter.launch_spec(with_proj, 1).argv
    assert argv[argv.index("--mmproj") + 1] == "/mmproj.gguf"
