"""The stream silence bound (`gateway.serving.silence`): from the plan's predicted step, with a floor and the
`upstream_timeout_s` ceiling, only for engines that speak every step (our llama.cpp worker)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from backends.base import DeploymentPlan, EngineCapabilities, EngineName, LlamaCppOptions
from backends.llamacpp import LlamaCppAdapter
from backends.lmdeploy import LMDeployAdapter
from backends.request import RequestKind
from gateway.serving.silence import SILENCE_MARGIN, stream_silence_s

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
