"""Images in chat through `voltgate serve`: the real llama.cpp worker, SmolLM2 with the tiny LLaVA projector.

The vision model is the embedded SmolLM2-135M with the random-weight image encoder that
tests/fixtures/vlm/build.py writes beside it (16 image tokens per image; the gateway finds the
`*mmproj*.gguf` beside the GGUF). Random weights say nothing about meaning, so these tests check that the
image reaches the model: the prompt grows by the image's 16 tokens, two different pictures give different
log-probabilities at temperature 0 and the same picture the same ones. Each API's shape is checked with
its own SDK (openai for chat and Responses, anthropic for Messages). A second model, the same GGUF without
a projector, must refuse images by name.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from PIL import Image

from tests.conftest import free_port
from tests.e2e.conftest import Gateway, model_entry, running_gateway, write_config
from tests.fixtures.vlm.build import vlm_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

VLM = "smollm2-vlm"
TEXT = "smollm2-text"
IMAGE_TOKENS = 16
QUESTION = "Describe the picture."
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 4}


def png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


def data_uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


RED, BLUE = png((220, 20, 20)), png((20, 20, 220))
GREEN = png((20, 200, 20))  # used by one test only, so no earlier request has it cached


@pytest.fixture(scope="module")
def gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("vision")
    model_dir = vlm_dir(tmp / "vlm", smollm2_path)
    models = [
        model_entry(model_dir / smollm2_path.name, name=VLM, concurrency=2),
        model_entry(smollm2_path, name=TEXT, concurrency=1),
    ]
    images = {"remote": {"allow_hosts": ["127.0.0.1", "10.0.0.1"], "timeout_s": 2}}
    config = write_config(tmp, smollm2_path, free_port(), models=models, max_body_bytes=64 * 1024 * 1024)
    text = config.read_text() + "images:\n" + "".join(f"  {line}\n" for line in _yaml(images).splitlines())
    config.write_text(text)
    with running_gateway(config, tmp / "gateway.log") as gw:
        yield gw


def _yaml(value: dict[str, Any]) -> str:
    return str(yaml.safe_dump(value))


def user_turn(content: list[dict[str, Any]]) -> Any:
    """One user message holding `content` (typed loosely: each SDK has its own TypedDicts for it)."""
    return [{"role": "user", "content": content}]


def chat_content(image: bytes | None) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if image is not None:
        parts.append({"type": "image_url", "image_url": {"url": data_uri(image), "detail": "auto"}})
    parts.append({"type": "text", "text": QUESTION})
    return parts


def chat(gateway: Gateway, image: bytes | None, model: str = VLM) -> Any:
    return gateway.client().chat.completions.create(
        model=model,
        messages=user_turn(chat_content(image)),
        logprobs=True,
        top_logprobs=3,
        **GREEDY,
    )


def _logprobs(completion: Any) -> list[tuple[str, float]]:
    return [(entry.token, round(entry.logprob, 4)) for entry in completion.choices[0].logprobs.content]


def test_models_show_vision_only_for_the_model_with_a_projector(gateway: Gateway) -> None:
    listed = httpx.get(gateway.base_url + "/models", timeout=10).json()["data"]
    vision = {m["id"]: m["capabilities"]["vision"] for m in listed}
    assert vision[VLM] is True and vision[TEXT] is False


def test_a_chat_image_adds_its_tokens_and_changes_the_answer(gateway: Gateway) -> None:
    text_only, red, green, red_again = chat(gateway, None), chat(gateway, RED), chat(gateway, GREEN), chat(gateway, RED)
    assert red.usage.prompt_tokens == text_only.usage.prompt_tokens + IMAGE_TOKENS
    assert green.usage.prompt_tokens == red.usage.prompt_tokens
    assert red.choices[0].message.content
    assert _logprobs(red) != _logprobs(green)  # the picture reaches the model
    assert _logprobs(red) == _logprobs(red_again)  # and the same picture gives the same answer
    # The second red reused the first's KV, image included; green could reuse only the text before it.
    assert red_again.usage.prompt_tokens_details.cached_tokens > red.usage.prompt_tokens - 4
    assert green.usage.prompt_tokens_details.cached_tokens < text_only.usage.prompt_tokens


def test_choices_of_one_image_prompt_share_it(gateway: Gateway) -> None:
    """n = 2 prefills the image once and copies the KV: at temperature 0 both choices are the single answer."""
    single = chat(gateway, BLUE)
    double = gateway.client().chat.completions.create(
        model=VLM, messages=user_turn(chat_content(BLUE)), n=2, logprobs=True, top_logprobs=3, **GREEDY
    )
    assert [c.message.content for c in double.choices] == [single.choices[0].message.content] * 2
    assert double.usage is not None and double.usage.prompt_tokens == single.usage.prompt_tokens


def test_a_responses_input_image_is_answered_in_the_responses_shape(gateway: Gateway) -> None:
    content = [{"type": "input_image", "image_url": data_uri(RED), "detail": "auto"},
               {"type": "input_text", "text": QUESTION}]  # fmt: skip
    response = gateway.client().responses.create(
        model=VLM,
        input=user_turn(content),
        max_output_tokens=4,
        temperature=0,
    )
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.usage is not None
    assert response.usage.input_tokens == chat(gateway, RED).usage.prompt_tokens


def test_an_anthropic_image_block_is_answered_as_a_message(gateway: Gateway) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(RED).decode()}}  # fmt: skip
    content: list[dict[str, Any]] = [image, {"type": "text", "text": QUESTION}]

    def ask(blocks: list[dict[str, Any]]) -> anthropic.types.Message:
        return client.messages.create(
            model=VLM, max_tokens=4, messages=user_turn(blocks),
            extra_body={"temperature": 0},
        )  # fmt: skip

    with_image, without = ask(content), ask(content[1:])
    assert with_image.type == "message" and with_image.content[0].type == "text"
    assert with_image.usage.input_tokens + (with_image.usage.cache_read_input_tokens or 0) == (
        without.usage.input_tokens + (without.usage.cache_read_input_tokens or 0) + IMAGE_TOKENS
    )


def test_a_text_only_model_refuses_images_naming_the_model_and_vision(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(gateway, RED, model=TEXT)
    error = caught.value.body
    assert isinstance(error, dict)
    assert TEXT in error["message"] and "vision" in error["message"]
    assert error["param"] == "messages[0].content[0].image_url"
    assert chat(gateway, None, model=TEXT).choices[0].message.content is not None


def _truncated_png() -> bytes:
    return RED[: len(RED) // 2]


BAD_IMAGES: dict[str, tuple[Callable[[], str], str]] = {
    "truncated PNG": (lambda: data_uri(_truncated_png()), "truncated"),
    "50 MB image": (lambda: "data:image/png;base64," + "A" * 50_000_000, "MiB"),
    "URL to 127.0.0.1": (lambda: "http://127.0.0.1:9/cat.png", "127.0.0.1"),
    "URL to 10.0.0.1": (lambda: "http://10.0.0.1/cat.png", "10.0.0.1"),
    "SVG": (lambda: data_uri(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml"), "SVG"),
    "wrong media type": (lambda: data_uri(RED, "image/jpeg"), "image/png"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_bad_images_are_a_clear_400_and_the_next_request_works(gateway: Gateway, case: str) -> None:
    make_url, expected = BAD_IMAGES[case]
    body = {
        "model": VLM,
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": make_url()}},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
    }
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert expected.lower() in error["message"].lower(), error
    assert error["param"] == "messages[0].content[0].image_url"
    assert chat(gateway, RED).choices[0].message.content  # nothing broke


def test_an_image_request_is_batched_beside_a_text_request(gateway: Gateway) -> None:
    """Both stream at once on the worker's two slots: each gets tokens while the other is still going."""
    events: list[tuple[str, str]] = []
    usage: dict[str, Any] = {}
    lock = threading.Lock()

    def ask(name: str, image: bytes | None) -> None:
        stream = gateway.client().chat.completions.create(
            model=VLM,
            messages=user_turn(chat_content(image)),
            temperature=0,
            max_tokens=48,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage[name] = chunk.usage
            elif chunk.choices and chunk.choices[0].delta.content:
                with lock:
                    events.append((name, "token"))

    threads = [threading.Thread(target=ask, args=("image", BLUE)), threading.Thread(target=ask, args=("text", None))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert usage["image"].completion_tokens == 48 and usage["text"].completion_tokens == 48
    assert usage["image"].prompt_tokens == usage["text"].prompt_tokens + IMAGE_TOKENS
    order = [name for name, _ in events]
    last = {name: max(i for i, n in enumerate(order) if n == name) for name in ("image", "text")}
    first = {name: order.index(name) for name in ("image", "text")}
    assert first["text"] < last["image"] and first["image"] < last["text"], order


def test_anthropic_errors_for_images_come_in_anthropics_shape(gateway: Gateway) -> None:
    url_block = {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/cat.png"}}
    for model, block, expected in (
        (VLM, url_block, "10.0.0.1"),
        (TEXT, {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": base64.b64encode(RED).decode()}}, "vision"),
    ):  # fmt: skip
        body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]}
        response = httpx.post(gateway.url + "/v1/messages", json=body, timeout=60)
        assert response.status_code == 400, response.text[:300]
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert expected in error["error"]["message"]
        if model == VLM:  # named by the client's block, not only `messages` (issue 35)
            assert error["error"]["message"].startswith("messages.0.content.0.source"), error
