"""Vision-language checkpoints: which ones TurboMind serves with images, and what their image encoder holds.

LMDeploy 0.18 runs the vision towers of these architectures inside TurboMind (`_turbomind_native_vision` in
lmdeploy/vl/model/{qwen2,internvl,internvl3_hf}.py; the C++ builders in lmdeploy/turbomind/models/
{qwen2_vl,internvl}.py), so the encoder's weights and activations sit on the same GPU as the text model and
must be counted in its fit (docs/vision.md, "TurboMind").
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TURBOMIND_VISION = {
    "Qwen2VLForConditionalGeneration": "Qwen2-VL ViT",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2.5-VL ViT",
    "InternVLChatModel": "InternViT",
    "InternVLForConditionalGeneration": "InternViT",
    "InternS1ForConditionalGeneration": "InternViT",
}
"""Architectures whose images TurboMind encodes (lmdeploy/turbomind/supported_models.py lines 12-13 and 23-25
of 0.18.0), and the encoder's name for the plan."""

VIT_ACTIVATION_ELEMENTS_PER_PATCH = 7
"""Activation allowance of the encoder, per patch of one image, in units of the encoder's width (fp16): the
residual, the norm's output, Q, K, V, the attention output and a spare, beside one row of the MLP's
intermediate and the patch's input values. Measured on the H200 (bench/results/2026-12-02-gpu-vlm/): encoding
one 65,536-patch image grew the worker by 1,600 and 1,760 MiB (random Qwen2-VL-2B, two runs) and 1,504 MiB
(Qwen2.5-VL-3B); 7 widths give 1,907 and 1,695 MiB, above each (6 gave 1,747: 0.7 % short of the second run).
See `vision_activation_bytes`."""


_INTERNVL_TILES = 12
"""InternVL's default `max_dynamic_patch` (448-pixel tiles per image), plus the thumbnail tile."""


class VisionTower(BaseModel):
    """A vision-language checkpoint's image encoder, from config.json's `vision_config` and the tensors' names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    depth: int = Field(ge=0, description="encoder blocks")
    hidden_size: int = Field(ge=1, description="the encoder's width")
    intermediate_size: int = Field(ge=1)
    patch_size: int = Field(ge=1)
    patch_in_dim: int = Field(ge=1, description="values per patch fed to the patch embedding")
    merge: int = Field(default=1, ge=1, description="patches merged into one text token (Qwen2-VL: 2x2 = 4)")
    max_patches: int = Field(ge=1, description="patches of the largest image the preprocessor makes")
    weights_bytes: int = Field(ge=0, description="encoder + projector tensors as loaded (float16), else estimated")
    config_weights_bytes: int = Field(ge=0, description="the same, estimated from vision_config alone")

    def describe(self) -> str:
        return f"{self.depth} blocks of width {self.hidden_size}, {self.patch_size}-pixel patches"


def _int(raw: dict[str, Any], *keys: str, default: int = 0) -> int:
    return int(next((raw[k] for k in keys if isinstance(raw.get(k), int | float)), default))


def vision_tower(config: dict[str, Any], path: Path, counted_bytes: int) -> VisionTower:
    """The tower described by `config["vision_config"]` (Qwen2-VL, Qwen2.5-VL and InternVL key names);
    `counted_bytes` are its tensors found in the checkpoint (0: none found, the estimate stands in)."""
    vc: dict[str, Any] = config["vision_config"]
    hidden = _int(vc, "embed_dim", "hidden_size", "width", default=1024)  # Qwen2-VL's hidden_size is its output
    inter = _int(vc, "intermediate_size", default=int(hidden * float(vc.get("mlp_ratio", 4))))
    patch = _int(vc, "patch_size", default=14)
    temporal = _int(vc, "temporal_patch_size", default=1)
    channels = _int(vc, "in_chans", "in_channels", "num_channels", default=3)
    if "spatial_merge_size" in vc:
        merge = _int(vc, "spatial_merge_size") ** 2
    else:
        merge = round(1 / float(config.get("downsample_ratio", 1.0)) ** 2)
    text = config.get("text_config") or config.get("llm_config") or config
    out = _int(vc, "out_hidden_size", default=_int(text, "hidden_size", default=hidden))
    gated = str(config.get("model_type", "")).startswith("qwen2_5")  # Qwen2.5-VL's MLP: gate, up and down
    depth = _int(vc, "depth", "num_hidden_layers", "num_layers")
    estimate = config_weights_bytes(depth, hidden, inter, channels * temporal * patch**2, hidden * merge, out, gated)
    return VisionTower(
        depth=depth,
        hidden_size=hidden,
        intermediate_size=inter,
        patch_size=patch,
        patch_in_dim=channels * temporal * patch**2,
        merge=merge,
        max_patches=_max_patches(config, vc, path, patch),
        weights_bytes=counted_bytes or estimate,
        config_weights_bytes=estimate,
    )


def config_weights_bytes(depth: int, hidden: int, inter: int, patch_in: int, merged: int, out: int, gated: bool) -> int:
    """fp16 bytes of a ViT and its projector from the shape alone (norms and biases left out): per block the
    attention's 4 x width^2 and the MLP's 2 (gated: 3) x width x intermediate, the patch embedding, and a
    two-layer projector from the merged patches (merged -> merged -> text width)."""
    block = 4 * hidden * hidden + (3 if gated else 2) * hidden * inter
    return 2 * (depth * block + patch_in * hidden + merged * merged + merged * out)


def _max_patches(config: dict[str, Any], vc: dict[str, Any], path: Path, patch: int) -> int:
    """Patches of the largest image: the Qwen image processor's `max_pixels`, else InternVL's tiles."""
    try:
        pre = json.loads((path / "preprocessor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pre = {}
    if isinstance(pre, dict):
        pixels = pre.get("max_pixels") or (pre.get("size") or {}).get("longest_edge")
        if isinstance(pixels, int) and pixels > 0:
            return max(1, pixels // (patch * patch))
    side = _int(vc, "image_size", default=448) // patch
    tiles = _int(config, "max_dynamic_patch", default=_INTERNVL_TILES) + 1
    return side * side * tiles


def vision_activation_bytes(tower: VisionTower, session_len: int) -> int:
    """The encoder's activations for the largest image one session can hold, fp16: the image's patches (its
    tokens, `patches / merge`, must fit in the session) times `VIT_ACTIVATION_ELEMENTS_PER_PATCH` widths plus
    one intermediate row and the patch's input values. TurboMind encodes one image at a time here (LMDeploy's
    `--vision-max-batch-size` is 1 by default)."""
    patches = min(tower.max_patches, tower.merge * session_len)
    per_patch = VIT_ACTIVATION_ELEMENTS_PER_PATCH * tower.hidden_size + tower.intermediate_size + tower.patch_in_dim
    return math.ceil(patches * per_patch * 2)
