"""The GGUF re-templating fixture: a copy of SmolLM2 that llama.cpp loads with another family's template."""

from __future__ import annotations

from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest

from backends.llamacpp.worker.tools import select_format
from backends.llamacpp.worker.tools.formats import HERMES, MISTRAL_V11
from tests.fixtures.gguf_templates import CHAT_TEMPLATE_KEY, retemplated_gguf, template_text


@pytest.fixture(scope="module")
def qwen_templated(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return retemplated_gguf(
        smollm2_path, tmp_path_factory.mktemp("gguf") / "smollm2-qwen.gguf", template_text("qwen2_5")
    )


def loaded_template(path: Path) -> str | None:
    """The chat template llama.cpp reads from the GGUF at `path`."""
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    assert model, f"llama.cpp could not load {path}"
    try:
        raw = llama_cpp.llama_model_chat_template(model, None)
        return raw.decode() if raw else None
    finally:
        llama_cpp.llama_model_free(model)


def test_llama_cpp_loads_the_copy_with_the_new_template(qwen_templated: Path) -> None:
    template = loaded_template(qwen_templated)
    assert template == template_text("qwen2_5")
    assert select_format(template) is HERMES


def test_the_copy_keeps_every_other_key_and_every_tensor(smollm2_path: Path, qwen_templated: Path) -> None:
    original, copy = gguf.GGUFReader(smollm2_path), gguf.GGUFReader(qwen_templated)
    keys = {k for k in original.fields if not k.startswith("GGUF.")}
    assert keys == {k for k in copy.fields if not k.startswith("GGUF.")}
    for key in keys - {CHAT_TEMPLATE_KEY}:
        assert copy.fields[key].contents() == original.fields[key].contents(), key
    assert [t.name for t in copy.tensors] == [t.name for t in original.tensors]
    for ours, theirs in zip(copy.tensors, original.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type
        assert np.array_equal(ours.data, theirs.data), ours.name


def test_any_fixture_template_can_be_carried(smollm2_path: Path, tmp_path: Path) -> None:
    path = retemplated_gguf(smollm2_path, tmp_path / "smollm2-mistral.gguf", template_text("mistral_small_3_2"))
    template = loaded_template(path)
    assert select_format(template) is MISTRAL_V11
