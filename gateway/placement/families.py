"""Which model architectures the TurboMind rungs may take: those LMDeploy's TurboMind runs, less those voltgate
cannot size for it yet. Everything else goes to llama.cpp (a GGUF source), the reason in the plan.

`TURBOMIND_RUNS` is `SUPPORTED_ARCHS` of `lmdeploy/turbomind/supported_models.py` in lmdeploy 0.18.0 (the
release `pyproject.toml` pins; read from its wheel, as `gateway.placement.vision` was): its converter looks each
checkpoint's `architectures[0]` up there and fails on any other (`SUPPORTED_ARCHS[arch]`, a KeyError), so a
Mistral, Baichuan, DeepSeek-V2 or InternLM (1) checkpoint, which older releases ran, does not start on it.

`TURBOMIND_UNSIZED` are the 2026 families 0.18 added whose memory terms the planner does not model for
TurboMind: placing them there would size the KV cache from a wrong estimate, so they stay on llama.cpp, which
the planner sizes for them (hybrid recurrent state and experts, `gateway.placement.estimate`), until their
terms are written and checked on the GPU machine (docs/placement.md, "Families").
"""

from __future__ import annotations

from gateway.placement.vision import TURBOMIND_VISION

TURBOMIND_RUNS = frozenset(
    {
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "InternVLChatModel",
        "InternVLForConditionalGeneration",
        "InternS1ForConditionalGeneration",
        "LlamaForCausalLM",
        "InternLM2ForCausalLM",
        "InternLM3ForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "GptOssForCausalLM",
        "MixtralForCausalLM",
    }
)
"""lmdeploy 0.18.0's `SUPPORTED_ARCHS` (lmdeploy/turbomind/supported_models.py, lines 8-37), in its order."""

TURBOMIND_UNSIZED = {
    "Qwen3_5ForConditionalGeneration": "its Gated DeltaNet layers' recurrent state per session (Qwen3.5)",
    "Qwen3_5MoeForConditionalGeneration": "its Gated DeltaNet layers' recurrent state per session (Qwen3.5 MoE)",
    "InternS2PreviewForConditionalGeneration": "its Qwen3.5-MoE layers' recurrent state per session",
    "InternS2MobiusForConditionalGeneration": "its layers (Intern-S2 Mobius)",
    "Glm4MoeLiteForCausalLM": "its multi-head latent attention's compressed KV (GLM-4.7-Flash)",
    "GptOssForCausalLM": "its sliding-window layers, attention sinks and MXFP4 experts (gpt-oss)",
}
"""Runs on TurboMind 0.18, not placed there by voltgate yet: what the planner does not size for it."""

TURBOMIND_ARCHITECTURES = TURBOMIND_RUNS - TURBOMIND_UNSIZED.keys()
"""What the TurboMind rungs take: the dense and MoE Llama, Qwen2/3, InternLM2/3 and Mixtral families and the
vision models whose encoder TurboMind runs (`TURBOMIND_VISION`)."""

assert TURBOMIND_VISION.keys() <= TURBOMIND_ARCHITECTURES, "a vision family TurboMind 0.18 does not run"


def turbomind_refusal(architecture: str) -> str | None:
    """Why the TurboMind rungs do not take `architecture`, or None when they do."""
    if architecture in TURBOMIND_UNSIZED:
        return (
            f"TurboMind (lmdeploy 0.18) runs {architecture}, but voltgate does not size "
            f"{TURBOMIND_UNSIZED[architecture]} for it yet"
        )
    if architecture not in TURBOMIND_ARCHITECTURES:
        return f"TurboMind (lmdeploy 0.18) does not run {architecture}"
    return None
