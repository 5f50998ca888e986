"""The silence bounds (`gateway.serving.silence`): a stream's from the plan's predicted step on engines that speak
every step (our llama.cpp worker), else its wait for the first token (LMDeploy); a non-streamed call's from its
whole predicted generation; with a floor and the `upstream_timeout_s` ceiling."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import httpx
import pytest

from backends.base import DeploymentPlan, EngineCapabilities, EngineName, LlamaCppOptions
from backends.llamacpp import LlamaCppAdapter
from backends.lmdeploy import LMDeployAdapter
from backends.request import (
    IMAGE_MARKER,
    AnyEngineRequest,
    EngineEmbeddingRequest,
    EngineImage,
    EngineRequest,
    RequestKind,
)
from gateway.config import ServerSettings
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.ops.metrics import Metrics
from gateway.serving.service import Service
from gateway.serving.silence import SILENCE_MARGIN, read_timeout_s, stream_silence_s

CHAT = frozenset({RequestKind.CHAT})
SPEAKS = EngineCapabilities(kinds=CHAT, longest_step_tokens=512)
CPU = SimpleNamespace(prefill_tok_s=252.7, decode_tok_s_per_stream=20.7)  # the embedded model's plan here
SLOW = SimpleNamespace(prefill_tok_s=20.0, decode_tok_s_per_stream=2.0)  # a 70B mostly in host memory


def test_a_fast_step_is_held_to_the_floor_and_a_slow_one_to_its_margin() -> None:
    assert stream_silence_s(SPEAKS, CPU, floor_s=60, ceiling_s=600) == 60
    slow = stream_silence_s(SPEAKS, SLOW, floor_s=60, ceiling_s=600)
    assert slow == pytest.approx(SILENCE_MARGIN * (512 / 20.0 + 1 / 2.0))  # 104 s: a step is 26.1 s
    assert stream_silence_s(SPEAKS, SLOW, floor_s=60, ceiling_s=90) == 90  # never past upstream_timeout_s


@pytest.mark.parametrize(
    ("capabilities", "prediction", "floor_s"),
    [
        (EngineCapabilities(kinds=CHAT), CPU, 60.0),  # silent for a whole prefill (LMDeploy, remote, vision)
        (SPEAKS, None, 60.0),  # no prediction
        (SPEAKS, CPU, None),  # turned off
    ],
)
def test_without_a_step_a_prediction_or_a_floor_the_ceiling_holds(
    capabilities: EngineCapabilities, prediction: object, floor_s: float | None
) -> None:
    assert stream_silence_s(capabilities, prediction, floor_s=floor_s, ceiling_s=600) == 600  # type: ignore[arg-type]


def test_our_worker_speaks_every_n_batch_step_but_not_through_an_image_or_on_lmdeploy() -> None:
    plan = DeploymentPlan(model="m", engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"), model_format="gguf",
                          context_tokens=1024, llamacpp=LlamaCppOptions(n_batch=1024))  # fmt: skip
    assert LlamaCppAdapter().capabilities(plan).longest_step_tokens == 1024
    vision = plan.model_copy(update={"mmproj": Path("/p.gguf")})
    assert LlamaCppAdapter().capabilities(vision).longest_step_tokens is None
    tm = plan.model_copy(update={"engine": EngineName.LMDEPLOY, "model_format": "hf"})
    assert LMDeployAdapter().capabilities(tm).longest_step_tokens is None


# -- every call: a non-streamed answer's whole generation, a stream silent until its first token --------------
LOADED = SimpleNamespace(prefill_tok_s=1000.0, decode_tok_s_per_stream=10.0, sessions=4, context_tokens=4096)
TURBOMIND = EngineCapabilities(kinds=CHAT)  # silent until the first token: no longest_step_tokens
ASK = EngineRequest(model="m", messages=({"role": "user", "content": "hi"},), max_tokens=256)
QUEUE_S = 3 * 4096 / 1000.0  # the 3 other sessions' prefills, each a whole context


def _bound(capabilities: EngineCapabilities, request: AnyEngineRequest, body_bytes: int = 2000, **kw: object) -> float:
    settings: dict[str, object] = {"floor_s": 5.0, "ceiling_s": 600.0, "prediction": LOADED, **kw}
    prediction = settings.pop("prediction")
    return read_timeout_s(capabilities, prediction, request, body_bytes, **settings)  # type: ignore[arg-type]


def test_a_unary_call_may_be_silent_for_the_queue_its_prompt_and_all_its_output_tokens() -> None:
    expected = SILENCE_MARGIN * (QUEUE_S + 2000 / 1000.0 + 256 / 10.0)  # 159.6 s; the prompt is 2,000 bytes
    assert _bound(TURBOMIND, ASK) == pytest.approx(expected)
    assert _bound(SPEAKS, ASK) == pytest.approx(expected)  # our worker sends nothing before a unary body either
    longer = ASK.model_copy(update={"max_tokens": 300})
    assert _bound(TURBOMIND, longer) == pytest.approx(expected + SILENCE_MARGIN * 44 / 10.0)
    assert _bound(TURBOMIND, ASK, body_bytes=10**6) == pytest.approx(SILENCE_MARGIN * (QUEUE_S + 4.096 + 25.6))
    alone = SimpleNamespace(**{**vars(LOADED), "sessions": 1})  # one slot: no queue in the worker
    assert _bound(TURBOMIND, ASK, prediction=alone) == pytest.approx(SILENCE_MARGIN * 27.6)


def test_a_unary_call_without_max_tokens_may_generate_its_whole_context_and_the_ceiling_and_floor_hold() -> None:
    unlimited = ASK.model_copy(update={"max_tokens": None})
    assert _bound(TURBOMIND, unlimited, ceiling_s=3600) == pytest.approx(SILENCE_MARGIN * (QUEUE_S + 2 + 409.6))
    assert _bound(TURBOMIND, unlimited) == 600  # never past upstream_timeout_s
    fast = SimpleNamespace(prefill_tok_s=1e6, decode_tok_s_per_stream=1e4, sessions=1, context_tokens=4096)
    assert _bound(TURBOMIND, ASK, prediction=fast) == 5.0  # a tiny answer on a fast GPU: the floor


def test_an_lmdeploy_stream_may_be_silent_until_its_first_token_and_ours_one_step() -> None:
    stream = ASK.model_copy(update={"stream": True})
    first_token_s = SILENCE_MARGIN * (QUEUE_S + 2000 / 1000.0 + 1 / 10.0)  # 57.6 s: max_tokens is no matter
    assert _bound(TURBOMIND, stream) == pytest.approx(first_token_s)
    assert _bound(TURBOMIND, stream.model_copy(update={"max_tokens": 4000})) == pytest.approx(first_token_s)
    assert _bound(SPEAKS, stream) == 5.0  # one step, 4 x 0.61 s: the floor
    assert _bound(SPEAKS, stream, floor_s=1.0) == pytest.approx(SILENCE_MARGIN * (512 / 1000.0 + 1 / 10.0))


IMAGE = EngineImage.of("image/png", b"\x89PNG", "0" * 64)
PICTURE = EngineRequest(model="m", messages=({"role": "user", "content": f"{IMAGE_MARKER} what?"},), images=(IMAGE,))


@pytest.mark.parametrize(
    ("capabilities", "request_", "settings"),
    [
        (TURBOMIND, ASK, {"prediction": None}),  # no prediction: a remote endpoint, or none planned
        (TURBOMIND, ASK, {"floor_s": None}),  # turned off
        (TURBOMIND.model_copy(update={"vision": True}), ASK, {}),  # another request's image may be encoding
        (TURBOMIND, PICTURE, {}),  # its image's encoding is not predicted
        (TURBOMIND, EngineEmbeddingRequest(model="m", input="hi"), {}),  # not a generation
    ],
)
def test_calls_whose_silence_is_not_predicted_keep_the_upstream_timeout(
    capabilities: EngineCapabilities, request_: AnyEngineRequest, settings: dict[str, object]
) -> None:
    assert _bound(capabilities, request_, **settings) == 600


async def test_a_remote_endpoint_keeps_the_upstream_timeout_even_with_a_prediction_of_its_name() -> None:
    async with httpx.AsyncClient() as client:
        service = Service(Registry(), client, ServerSettings(stream_silence_floor_s=1.0), Metrics(gpu=False))
        service.metrics.live.predictions["m"] = LOADED  # type: ignore[assignment]
        for url, bound in ((None, SILENCE_MARGIN * (QUEUE_S + 2 + 25.6)), ("https://api.example", 600)):
            plan = SimpleNamespace(remote_url=url)
            deployment = cast(Deployment, SimpleNamespace(name="m", capabilities=TURBOMIND, plan=plan))
            assert service._silence_s(deployment, ASK, 2000) == pytest.approx(bound), url
