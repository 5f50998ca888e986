"""Which of LMDeploy's tool-call parsers (`--tool-call-parser`) reads a model's calls, from its architecture.

LMDeploy 0.18 ships `qwen` (Qwen2/2.5: Hermes `<tool_call>` JSON), `qwen3`, `qwen3coder` (XML calls),
`llama3` (Llama 3.x JSON calls) and `internlm` (InternLM2/2.5). A model none of them reads gets no parser:
its TurboMind deployment then refuses `tools` with a 400 naming the parameter (`lmdeploy.tool_parser` in
the config names one explicitly).
"""

from __future__ import annotations

from gateway.placement.inspection import SourceInfo

LLAMA3_VOCAB = 128_256
"""Llama 3.x's vocabulary size: what tells a Llama 3 checkpoint (which calls tools) from a Llama 2 one."""

_BY_ARCHITECTURE = {
    "Qwen2ForCausalLM": "qwen",
    "Qwen2VLForConditionalGeneration": "qwen",
    "Qwen2_5_VLForConditionalGeneration": "qwen",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3",
    "InternLM2ForCausalLM": "internlm",
    "InternLM3ForCausalLM": "internlm",
}


def tool_parser_for(source: SourceInfo) -> str | None:
    """LMDeploy's tool-call parser for `source`'s architecture, or None if it has none."""
    arch = source.shape.architecture
    if arch in ("LlamaForCausalLM", "MistralForCausalLM") and source.shape.vocab_size >= LLAMA3_VOCAB:
        return "llama3"
    return _BY_ARCHITECTURE.get(arch)
