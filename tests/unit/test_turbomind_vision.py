"""TurboMind's vision-language models: the LMDeploy adapter's image parts, the `vision` capability from the
architecture, and the image encoder's memory in the placement and its explanation.

These run on the CPU against header-only checkpoints of Qwen2-VL-2B's real shape (no weights). The real TurboMind
with images runs only on the GPU machine: bench/gpu/vlm_turbomind.py through bench/gpu/run_session3.sh's `vlm`
step, results in bench/results/2026-12-02-gpu-vlm/.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from backends.base import DeploymentPlan, EngineName
from backends.lmdeploy import LMDeployAdapter, image_messages
from backends.request import IMAGE_MARKER, EngineImage, EngineMessage, EngineRequest
from bench.gpu.make_vlm import config as qwen2_vl_config
from bench.gpu.make_vlm import tensor_shapes
from gateway.config import Config
from gateway.placement import inventory_from_spec, plan_models, render_plan_table
from gateway.placement.estimate import TurboMindFit, fit_turbomind
from gateway.placement.inspection import inspect_hf_dir
from gateway.placement.inventory import GIB
from gateway.placement.vision import VIT_ACTIVATION_ELEMENTS_PER_PATCH, vision_activation_bytes
from tests.unit.placement_models import QWEN2_0_5B, write_hf_model, write_safetensors

PNG = bytes.fromhex("89504e470d0a1a0a") + b"first"
JPEG = bytes.fromhex("ffd8ffe0") + b"second"


def _image(raw: bytes, media_type: str) -> EngineImage:
    return EngineImage.of(media_type, raw, "0" * 64)  # type: ignore[arg-type]


def _plan(vision_encoder: str | None) -> DeploymentPlan:
    return DeploymentPlan(model="vlm", engine=EngineName.LMDEPLOY, source_path=Path("/m"), model_format="hf",
                          context_tokens=4096, vision_encoder=vision_encoder)  # fmt: skip


def test_each_marker_becomes_an_image_url_part_holding_its_image_as_a_data_uri() -> None:
    a, b = _image(PNG, "image/png"), _image(JPEG, "image/jpeg")
    messages = [
        {"role": "system", "content": f"keep {IMAGE_MARKER} literal here? no: only user markers are images"},
        {"role": "user", "content": f"{IMAGE_MARKER}What differs from{IMAGE_MARKER}{IMAGE_MARKER} this?"},
    ]
    out = image_messages(messages[1:], (a, b, a))
    assert out == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": a.data_uri()}},
                {"type": "text", "text": "What differs from"},
                {"type": "image_url", "image_url": {"url": b.data_uri()}},
                {"type": "image_url", "image_url": {"url": a.data_uri()}},
                {"type": "text", "text": " this?"},
            ],
        }
    ]
    assert out[0]["content"][2]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_an_image_request_reaches_lmdeploy_as_openai_content_parts_and_no_images_field() -> None:
    image = _image(PNG, "image/png")
    request = EngineRequest(
        model="vlm",
        messages=(
            EngineMessage(role="system", content="Be brief."),
            EngineMessage(role="user", content=f"{IMAGE_MARKER}Describe it."),
        ),
        images=(image,),
        max_tokens=8,
    )
    body = LMDeployAdapter().translate_request(request)
    assert "images" not in body
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image.data}},
        {"type": "text", "text": "Describe it."},
    ]
    assert body["max_tokens"] == 8


def test_a_text_request_keeps_its_string_content() -> None:
    request = EngineRequest(model="vlm", messages=(EngineMessage(role="user", content="hi"),))
    assert LMDeployAdapter().translate_request(request)["messages"] == [{"role": "user", "content": "hi"}]


def test_vision_is_true_only_for_a_plan_with_a_turbomind_vision_encoder() -> None:
    adapter = LMDeployAdapter()
    assert adapter.capabilities(_plan("Qwen2-VL ViT")).public()["vision"] is True
    assert adapter.capabilities(_plan(None)).public()["vision"] is False


def _qwen2_vl_2b(directory: Path, max_pixels: int = 12845056) -> Path:
    """A header-only Qwen2-VL-2B-Instruct checkpoint (the real tensor names and shapes, vocabulary 32,064)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = qwen2_vl_config("2b")
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "preprocessor_config.json").write_text(json.dumps({"max_pixels": max_pixels, "patch_size": 14}))
    write_safetensors(directory / "model.safetensors", [(n, "BF16", s) for n, s in tensor_shapes(config)])
    return directory


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _qwen2_vl_2b(tmp_path_factory.mktemp("qwen2vl") / "qwen2-vl-2b")


def test_the_vision_tower_is_read_from_the_config_and_its_tensors_counted_apart(vlm_dir: Path) -> None:
    config = qwen2_vl_config("2b")
    source = inspect_hf_dir(vlm_dir)
    visual = sum(2 * math.prod(s) for n, s in tensor_shapes(config) if n.startswith("visual."))
    tower = source.vision
    assert tower is not None
    assert (tower.depth, tower.hidden_size, tower.intermediate_size, tower.patch_size) == (32, 1280, 5120, 14)
    assert (tower.patch_in_dim, tower.merge, tower.max_patches) == (3 * 2 * 14 * 14, 4, 65536)
    assert tower.weights_bytes == visual  # counted from the `visual.*` tensors: 1.24 GiB
    # the config alone gives the same within 1 % (norms and biases are what it leaves out)
    assert abs(tower.config_weights_bytes - visual) / visual < 0.01
    # the encoder's 32 `visual.blocks.N` are not the text model's 28 layers
    assert sum(source.layer_bytes) + source.embedding_bytes + source.output_bytes + visual == source.weights_bytes
    assert source.shape.n_layers == 28 and source.shape.head_dim == 128 and source.shape.n_kv_heads == 2


def test_the_activation_allowance_is_the_largest_image_a_session_holds(vlm_dir: Path) -> None:
    tower = inspect_hf_dir(vlm_dir).vision
    assert tower is not None
    per_patch = 2 * (VIT_ACTIVATION_ELEMENTS_PER_PATCH * 1280 + 5120 + 1176)
    assert vision_activation_bytes(tower, 32768) == 65536 * per_patch  # max_pixels bounds it: 16,384 tokens
    assert vision_activation_bytes(tower, 4096) == 4 * 4096 * per_patch  # the session bounds it: 4,096 tokens


def test_the_fit_counts_the_encoder_outside_the_kv_cache_as_its_own_term(vlm_dir: Path) -> None:
    source = inspect_hf_dir(vlm_dir)
    assert source.vision is not None
    common = dict(gpu_indices=(0,), free_bytes=15 * GIB, session_len=8192, concurrency=2, extra_kv=True)
    text_only = fit_turbomind(source, **common)  # type: ignore[arg-type]
    with_images = fit_turbomind(source, vision=True, **common)  # type: ignore[arg-type]
    assert isinstance(text_only, TurboMindFit) and isinstance(with_images, TurboMindFit)
    activations = vision_activation_bytes(source.vision, 8192)
    est = with_images.estimate
    assert est.vision_encoder_bytes == source.vision.weights_bytes + activations
    assert est.weights_bytes + source.vision.weights_bytes == source.weights_bytes
    assert est.terms_gib["vision_encoder"] == round((source.vision.weights_bytes + activations) / GIB, 2)
    # the activations are taken out of what the KV cache may have, not added on top of the GPU's memory
    assert est.kv_cache_bytes < text_only.estimate.kv_cache_bytes
    assert sum(est.gpu_bytes.values()) == est.weights_bytes + est.kv_cache_bytes + est.runtime_bytes + (
        est.vision_encoder_bytes + est.cuda_context_bytes
    )


def test_the_plan_serves_images_and_says_what_it_counts_for_the_encoder(vlm_dir: Path, tmp_path: Path) -> None:
    write_hf_model(tmp_path / "qwen2-0.5b", QWEN2_0_5B)
    config = Config.model_validate(
        {
            "gpus": "v100-16gb",
            "models": [
                {"name": "vlm", "sources": [{"hf": str(vlm_dir)}], "context": 20480, "concurrency": 4},
                {"name": "text", "sources": [{"hf": str(tmp_path / "qwen2-0.5b")}], "context": 2048},
            ],
        }
    )
    report = plan_models(config, inventory_from_spec(config.gpus))
    by_model = {d.model: d for d in report.decisions}
    vlm, text = by_model["vlm"], by_model["text"]
    assert vlm.plan is not None and vlm.plan.engine == EngineName.LMDEPLOY
    assert vlm.plan.vision_encoder == "Qwen2-VL ViT" and vlm.plan.tool_parser == "qwen"
    assert LMDeployAdapter().capabilities(vlm.plan).vision
    note = next(n for n in vlm.notes if n.startswith("vision encoder"))
    assert "Qwen2-VL ViT, 32 blocks of width 1280" in note and "65536 patches, 16384 tokens" in note
    assert "weights 1.24 GiB" in note and "outside the KV cache" in note
    assert text.plan is not None and text.plan.vision_encoder is None
    assert not LMDeployAdapter().capabilities(text.plan).vision
    out = io.StringIO()
    render_plan_table(report, Console(file=out, width=240, color_system=None))
    assert "vision_encoder" in out.getvalue() and "vision encoder (Qwen2-VL ViT" in out.getvalue()


def test_an_internvl_tower_is_read_from_its_own_key_names(tmp_path: Path) -> None:
    """InternVL's original layout: the text model under `llm_config`, the InternViT under `vision_config` with
    `num_hidden_layers`/`hidden_size`, 448-pixel tiles (12 + a thumbnail) and a 0.5 pixel-shuffle."""
    config = {
        "architectures": ["InternVLChatModel"],
        "downsample_ratio": 0.5,
        "max_dynamic_patch": 12,
        "llm_config": {**QWEN2_0_5B, "architectures": ["Qwen2ForCausalLM"]},
        "vision_config": {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "patch_size": 14,
            "image_size": 448,
            "num_channels": 3,
        },
    }
    directory = tmp_path / "internvl2-1b"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    tensors = [
        ("vision_model.embeddings.patch_embedding.weight", "BF16", (1024, 3, 14, 14)),
        ("language_model.model.layers.0.mlp.up_proj.weight", "BF16", (4864, 896)),
    ]
    write_safetensors(directory / "model.safetensors", tensors)
    source = inspect_hf_dir(directory)
    tower = source.vision
    assert tower is not None and source.shape.architecture == "InternVLChatModel"
    assert (tower.depth, tower.hidden_size, tower.merge, tower.max_patches) == (24, 1024, 4, 32 * 32 * 13)
    assert tower.weights_bytes == 2 * 1024 * 3 * 14 * 14  # the one `vision_model.*` tensor, counted
    assert source.layer_bytes[0] == 2 * 4864 * 896  # the text layer is still the text model's
