"""Which of LMDeploy's parsers reads a model's tool calls (`--tool-call-parser`, from its architecture) and its
thinking (`--reasoning-parser`, from its family).

LMDeploy 0.18 ships `qwen` (Qwen2/2.5: Hermes `<tool_call>` JSON), `qwen3`, `qwen3coder` (XML calls),
`llama3` (Llama 3.x JSON calls) and `internlm` (InternLM2/2.5). A model none of them reads gets no parser:
its TurboMind deployment then refuses `tools` with a 400 naming the parameter (`lmdeploy.tool_parser` in
the config names one explicitly).
"""

from __future__ import annotations

import json
from pathlib import Path

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
    if arch == "LlamaForCausalLM" and source.shape.vocab_size >= LLAMA3_VOCAB:
        return "llama3"
    return _BY_ARCHITECTURE.get(arch)


# LMDeploy 0.18's reasoning parsers: `default` reads the `<think>...</think>` families (Qwen3, QwQ, DeepSeek-R1
# and its distills, Intern-S1); the DeepSeek V3.x parsers start in thinking only when the template switch
# says so. gpt-oss needs none: LMDeploy reads its harmony channels by itself.
_THINKING_ARCHITECTURES = {
    "Qwen3ForCausalLM": "default",
    "Qwen3MoeForCausalLM": "default",
    "InternS1ForConditionalGeneration": "default",
    "DeepseekV3ForCausalLM": "deepseek-v3",
    "DeepseekV32ForCausalLM": "deepseek-v32",
}


def reasoning_parser_for(source: SourceInfo) -> str | None:
    """LMDeploy's reasoning parser for `source`: by architecture where it says the family, else `default` when
    the checkpoint's chat template thinks in `<think>` tags (a DeepSeek-R1 distill is a Qwen2 or Llama by
    architecture); None for a model that does not think."""
    parser = _THINKING_ARCHITECTURES.get(source.shape.architecture)
    if parser is None and "<think>" in _chat_template(source.path):
        parser = "default"
    return parser


def _chat_template(path: Path) -> str:
    """An HF checkpoint's chat template text (`chat_template.jinja`, or `tokenizer_config.json`'s), "" if none."""
    folder = path if path.is_dir() else path.parent
    try:
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = " ".join(t.get("template", "") for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""
