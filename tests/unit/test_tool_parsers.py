"""The plan picks LMDeploy's tool-call parser from the architecture; models without one get none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.placement.inspection import ModelShape, SourceInfo
from gateway.placement.tool_parsers import reasoning_parser_for, tool_parser_for


def source(architecture: str, vocab: int = 32_000) -> SourceInfo:
    shape = ModelShape(architecture=architecture, n_layers=2, hidden_size=64, n_heads=2, n_kv_heads=2, head_dim=32,
                       v_head_dim=32, ffn_size=128, vocab_size=vocab)  # fmt: skip
    return SourceInfo(path=Path("/m"), format="hf", shape=shape, weights_bytes=1, layer_bytes=(1, 1),
                      embedding_bytes=0, output_bytes=0, n_params=1, file_bytes=1)  # fmt: skip


@pytest.mark.parametrize(
    ("architecture", "vocab", "parser"),
    [
        ("Qwen2ForCausalLM", 151_936, "qwen"),
        ("Qwen3ForCausalLM", 151_936, "qwen3"),
        ("LlamaForCausalLM", 128_256, "llama3"),
        ("LlamaForCausalLM", 32_000, None),  # Llama 2: no tool-call format
        ("InternLM2ForCausalLM", 92_544, "internlm"),
        ("GPT2LMHeadModel", 50_257, None),
    ],
)
def test_the_tool_parser_follows_the_architecture(architecture: str, vocab: int, parser: str | None) -> None:
    assert tool_parser_for(source(architecture, vocab)) == parser


@pytest.mark.parametrize(
    ("architecture", "template", "parser"),
    [
        ("Qwen3ForCausalLM", None, "default"),
        ("Qwen3MoeForCausalLM", None, "default"),
        ("DeepseekV3ForCausalLM", None, "deepseek-v3"),
        ("Qwen2ForCausalLM", "{{ '<think>\\n' }}", "default"),  # a DeepSeek-R1 distill: a Qwen2 that thinks
        ("Qwen2ForCausalLM", "{{ messages }}", None),
        ("LlamaForCausalLM", None, None),
    ],
)
def test_the_reasoning_parser_follows_the_family(
    tmp_path: Path, architecture: str, template: str | None, parser: str | None
) -> None:
    if template is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    info = source(architecture).model_copy(update={"path": tmp_path})
    assert reasoning_parser_for(info) == parser


def test_a_chat_template_file_is_read_too(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{%- if enable_thinking %}<think>{% endif %}")
    assert reasoning_parser_for(source("LlamaForCausalLM").model_copy(update={"path": tmp_path})) == "default"
