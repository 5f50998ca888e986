"""Embedding and rerank models in the config, the placement plan and the llama.cpp adapter's argv.

Model files: the tiny BERT GGUFs of `tests.fixtures.tiny_bert` (real files llama.cpp loads), the real SmolLM2
GGUF, and header-only GGUFs of real embedding checkpoints' shapes (bge-m3, its reranker, nomic-embed-text),
sparse like tests/unit/placement_models.py, so sizes come from the headers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from backends.base import DeploymentPlan, EngineName, RequestKind
from backends.llamacpp import LlamaCppAdapter
from gateway.config import Config, ConfigError, ModelSpec, load_config
from gateway.placement import PlacementReport, inventory_from_spec, plan_models
from gateway.placement.embedding import pass_memory, serving_task
from gateway.placement.estimate import MARGIN_BYTES
from gateway.placement.inspection import inspect_gguf
from gateway.placement.inventory import GIB
from tests.conftest import REPO
from tests.fixtures.tiny_bert import write_tiny_bert
from tests.unit.placement_models import LLAMA2_7B, LLAMA2_70B, write_gguf, write_hf_model

BGE_M3: dict[str, Any] = {"arch": "bert", "layers": 24, "hidden": 1024, "heads": 16, "ffn": 4096, "vocab": 250002,
                          "ctx": 8192, "pooling": gguf.PoolingType.CLS}  # fmt: skip
NOMIC_EMBED: dict[str, Any] = {"arch": "nomic-bert", "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072,
                               "vocab": 30522, "ctx": 2048, "pooling": gguf.PoolingType.MEAN}  # fmt: skip


def write_encoder_gguf(path: Path, shape: dict[str, Any], *, rerank: bool = False) -> Path:
    """A header-only F16 BERT-family GGUF: every tensor info of the real model, data section sparse."""
    h, ffn, layers = shape["hidden"], shape["ffn"], shape["layers"]
    tensors: list[tuple[str, tuple[int, ...]]] = [
        ("token_embd.weight", (shape["vocab"], h)), ("token_types.weight", (2, h)),
        ("position_embd.weight", (shape["ctx"], h)), ("token_embd_norm.weight", (h,)), ("token_embd_norm.bias", (h,)),
    ]  # fmt: skip
    for i in range(layers):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors += [(f"blk.{i}.{name}.weight", (h, h)), (f"blk.{i}.{name}.bias", (h,))]
        tensors += [(f"blk.{i}.ffn_up.weight", (ffn, h)), (f"blk.{i}.ffn_up.bias", (ffn,)),
                    (f"blk.{i}.ffn_down.weight", (h, ffn)), (f"blk.{i}.ffn_down.bias", (h,))]  # fmt: skip
        for norm in ("attn_output_norm", "layer_output_norm"):
            tensors += [(f"blk.{i}.{norm}.weight", (h,)), (f"blk.{i}.{norm}.bias", (h,))]
    if rerank:
        tensors += [("cls.weight", (h, h)), ("cls.bias", (h,))]
        tensors += [("cls.output.weight", (1, h)), ("cls.output.bias", (1,))]
    writer = gguf.GGUFWriter(str(path), shape["arch"])
    writer.add_block_count(layers)
    writer.add_context_length(shape["ctx"])
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(shape["heads"])
    writer.add_vocab_size(shape["vocab"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK if rerank else shape["pooling"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    data = 0
    for name, dims in tensors:
        qtype = gguf.GGMLQuantizationType.F16 if len(dims) == 2 else gguf.GGMLQuantizationType.F32
        nbytes = int(np.prod(dims)) * (2 if len(dims) == 2 else 4)
        writer.add_tensor_info(name, (*dims[:-1], dims[-1] * (2 if len(dims) == 2 else 4)), np.dtype(np.uint8),
                               nbytes, raw_dtype=qtype)  # fmt: skip
        data += -(-nbytes // 32) * 32
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    os.truncate(path, -(-os.path.getsize(path) // 32) * 32 + data)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    root = tmp_path_factory.mktemp("embedding-models")
    write_tiny_bert(root / "tiny-bert.gguf")
    write_tiny_bert(root / "tiny-reranker.gguf", rerank=True)
    write_encoder_gguf(root / "bge-m3.F16.gguf", BGE_M3)
    write_encoder_gguf(root / "bge-reranker-v2-m3.F16.gguf", BGE_M3, rerank=True)
    write_encoder_gguf(root / "nomic-embed-text-v1.5.F16.gguf", NOMIC_EMBED)
    write_gguf(root / "llama2-7b.Q4_K_M.gguf", LLAMA2_7B, "Q4_K_M")
    write_gguf(root / "llama2-70b.Q4_K_M.gguf", LLAMA2_70B, "Q4_K_M")
    write_hf_model(root / "llama2-7b", LLAMA2_7B)
    (root / "smollm2.gguf").symlink_to(smollm2_path)
    return root


def plan(models: Path, gpus: str, *entries: dict[str, Any]) -> PlacementReport:
    config = Config.model_validate({"gpus": gpus, "models": list(entries), "base_dir": models})
    report = plan_models(config, inventory_from_spec(gpus))
    for gpu in report.inventory.gpus:  # never over-committed, whatever shares it
        used = sum(d.estimate.gpu_bytes.get(gpu.index, 0) for d in report.decisions if d.plan and d.estimate)
        assert used <= gpu.free_bytes - MARGIN_BYTES, f"GPU {gpu.index} over-committed"
    return report


def model(name: str, path: str, **settings: Any) -> dict[str, Any]:
    return {"name": name, "sources": [{"gguf": path}], **settings}


def spec(path: str, **settings: Any) -> ModelSpec:
    return ModelSpec.model_validate(model("m", path, **settings))


# --- the task --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "settings", "task"),
    [
        ("tiny-bert.gguf", {}, "embed"),  # an encoder declaring mean pooling
        ("nomic-embed-text-v1.5.F16.gguf", {}, "embed"),
        ("tiny-reranker.gguf", {}, "rerank"),  # pooling rank
        ("bge-reranker-v2-m3.F16.gguf", {}, "rerank"),
        ("smollm2.gguf", {}, "generate"),  # a decoder declaring no pooling
        ("smollm2.gguf", {"pooling": "mean"}, "embed"),
        ("smollm2.gguf", {"task": "embed", "pooling": "last"}, "embed"),
        ("tiny-bert.gguf", {"task": "generate"}, "generate"),  # the config wins
        ("missing.gguf", {}, "generate"),  # unreadable: the generation path reports it
    ],
)
def test_the_task_comes_from_the_config_else_the_gguf_header(
    models: Path, path: str, settings: dict[str, Any], task: str
) -> None:
    assert serving_task(spec(path, **settings), models) == task


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"task": "generate", "pooling": "mean"}, "pooling: only for task embed or rerank"),
        ({"task": "generate", "matryoshka": True}, "matryoshka: only for task embed or rerank"),
        ({"task": "embed", "pooling": "rank"}, "pooling rank is a reranker's: set task: rerank"),
        ({"task": "rerank", "pooling": "cls"}, "a reranker pools by rank, not cls"),
        ({"task": "rerank", "matryoshka": True}, "not rerankers"),
        ({"task": "embed", "engine": "lmdeploy"}, "task embed runs on llama.cpp"),
        ({"embed_batch": 0}, "embed_batch: Input should be greater than or equal to 1"),
    ],
)
def test_pooled_settings_that_contradict_each_other_are_config_errors(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    import yaml

    path = tmp_path / "voltgate.yaml"
    path.write_text(yaml.safe_dump({"models": [model("m", "m.gguf", **settings)]}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "models.0" in str(info.value) and message in str(info.value), str(info.value)


def test_a_remote_endpoint_takes_no_task() -> None:
    with pytest.raises(ValueError, match="a remote endpoint answers for itself"):
        ModelSpec.model_validate({"name": "m", "sources": [{"remote": "http://gpu-2:8000/v1"}], "task": "embed"})


# --- placement -------------------------------------------------------------------------------------------


def test_an_encoder_runs_on_the_cpu_without_gpus_with_the_reasons(models: Path) -> None:
    report = plan(models, "none", model("bert", "tiny-bert.gguf", context=512, matryoshka=True, embed_batch=16))
    d = report.decision("bert")
    assert d.plan is not None and d.estimate is not None, d.refusal
    p = d.plan
    assert (p.engine, p.task, p.n_gpu_layers, p.gpu_indices, p.slots) == (EngineName.LLAMACPP, "embed", 0, (), 16)
    assert p.context_tokens == 128 and p.matryoshka and p.pooling is None  # capped at the trained context
    assert d.rung == "llamacpp-embed-cpu"
    assert d.estimate.kv_cache_bytes == 0 and d.estimate.gpu_bytes == {}
    notes = " ".join(d.notes)
    assert "an encoder (bert): no KV cache" in notes and "mean pooling (from the GGUF)" in notes
    assert "capped at the 128 tokens" in notes and "output buffer" in notes and "on the CPU" in notes
    assert [r.rung for r in d.rejected] == ["llamacpp-embed-gpu"]
    assert report.start_order == ["bert"]


def test_a_decoder_holds_one_pass_of_kv_and_logits_for_every_token(models: Path) -> None:
    report = plan(models, "none", model("e", "smollm2.gguf", task="embed", pooling="mean", context=256))
    d = report.decision("e")
    assert d.plan is not None and d.estimate is not None, d.refusal
    info = inspect_gguf(models / "smollm2.gguf")
    shape, n_batch = info.shape, 512  # llamacpp.n_batch, at least the context
    assert d.estimate.kv_cache_bytes == n_batch * shape.kv_bytes_per_token(2.0)
    output = n_batch * (shape.vocab_size + shape.hidden_size) * 4
    assert output == 512 * (49152 + 576) * 4  # 97 MiB: the output buffer the brief's formula gives
    memory = pass_memory(info, encoder=False, n_batch=n_batch)
    assert memory.output_bytes == output and memory.compute_bytes > n_batch * shape.vocab_size * 4
    assert d.estimate.runtime_bytes == memory.compute_bytes + output
    assert d.estimate.host_bytes == d.estimate.weights_bytes + d.estimate.kv_cache_bytes + d.estimate.runtime_bytes
    assert (d.plan.task, d.plan.pooling, d.plan.context_tokens) == ("embed", "mean", 256)
    assert "a decoder (llama): KV cache" in " ".join(d.notes) and "mean pooling (config)" in " ".join(d.notes)


def test_the_output_buffer_grows_with_the_context_and_the_vocabulary(models: Path) -> None:
    """bge-m3's 250k vocabulary at its full 8192-token context: 7.6 GiB of logits in host memory."""
    info = inspect_gguf(models / "bge-m3.F16.gguf")
    full = pass_memory(info, encoder=True, n_batch=8192)
    short = pass_memory(info, encoder=True, n_batch=512)
    assert full.kv_bytes == short.kv_bytes == 0
    assert full.output_bytes == 8192 * (250002 + 1024) * 4 and full.output_bytes / GIB == pytest.approx(7.66, abs=0.01)
    assert full.output_bytes == 16 * short.output_bytes
    d = plan(models, "v100-16gb", model("bge", "bge-m3.F16.gguf", context=8192)).decision("bge")
    assert d.plan is not None and d.estimate is not None, d.refusal
    assert d.estimate.host_bytes >= full.output_bytes  # the buffer lives in host memory, not on the GPU
    assert any("output buffer 7.66 GiB" in n and "8192 x 250002" in n for n in d.notes), d.notes


def test_an_embedding_model_shares_a_gpu_with_a_generation_model_and_starts_after_it(models: Path) -> None:
    report = plan(
        models,
        "v100-16gb",
        model("nomic", "nomic-embed-text-v1.5.F16.gguf", context=2048),
        model("llama", "llama2-7b.Q4_K_M.gguf", context=4096, concurrency=2),
    )
    nomic, llama = report.decision("nomic"), report.decision("llama")
    assert nomic.plan is not None and llama.plan is not None, (nomic.refusal, llama.refusal)
    assert llama.plan.gpu_indices == nomic.plan.gpu_indices == (0,)
    assert (nomic.rung, nomic.plan.n_gpu_layers, nomic.plan.task) == ("llamacpp-embed-gpu", -1, "embed")
    assert report.start_order == ["llama", "nomic"]
    assert any("on GPU 0, the one with the most room" in n for n in nomic.notes), nomic.notes
    assert nomic.estimate is not None and nomic.estimate.kv_cache_bytes == 0


def test_turbomind_keeps_its_kv_cache_to_the_target_when_an_embedding_model_shares_its_gpu(models: Path) -> None:
    alone = plan(models, "v100-32gb", {"name": "llama", "sources": [{"hf": "llama2-7b"}], "context": 4096})
    shared = plan(
        models,
        "v100-32gb",
        {"name": "llama", "sources": [{"hf": "llama2-7b"}], "context": 4096},
        model("rr", "bge-reranker-v2-m3.F16.gguf", context=1024),
    )
    rr, tm = shared.decision("rr"), shared.decision("llama")
    assert rr.plan is not None and rr.plan.task == "rerank" and rr.plan.gpu_indices == (0,), rr.refusal
    assert rr.rung == "llamacpp-rerank-gpu" and tm.plan is not None and tm.plan.engine is EngineName.LMDEPLOY
    assert "GPU shared with another model: the KV cache is kept to the target" in tm.warnings
    assert tm.estimate is not None and alone.decision("llama").estimate is not None
    assert tm.estimate.kv_cache_bytes < alone.decision("llama").estimate.kv_cache_bytes  # type: ignore[union-attr]
    assert shared.start_order == ["llama", "rr"]  # TurboMind sizes its cache from what is free when it starts


def test_an_embedding_model_runs_on_the_cpu_when_the_generation_models_fill_the_gpus(models: Path) -> None:
    report = plan(
        models,
        "v100-16gb",
        model("llama", "llama2-70b.Q4_K_M.gguf"),  # partial offload: as many layers as the GPU holds
        model("bge", "bge-m3.F16.gguf", context=8192),
    )
    assert report.decision("llama").rung == "llamacpp-partial"
    bge = report.decision("bge")
    assert bge.plan is not None and bge.rung == "llamacpp-embed-cpu", bge.refusal
    (miss,) = [r for r in bge.rejected if r.rung == "llamacpp-embed-gpu"]
    assert "needs" in miss.reason and "on GPU 0 (the most room left)" in miss.reason


def test_n_gpu_layers_zero_keeps_an_embedding_model_on_the_cpu(models: Path) -> None:
    d = plan(models, "v100-16gb", model("bert", "tiny-bert.gguf", llamacpp={"n_gpu_layers": 0})).decision("bert")
    assert d.plan is not None and d.plan.n_gpu_layers == 0 and d.rung == "llamacpp-embed-cpu"
    assert ("llamacpp-embed-gpu", "n_gpu_layers: 0 in the config") in d.rejected


@pytest.mark.parametrize(
    ("entry", "refusal"),
    [
        (model("e", "smollm2.gguf", task="embed"), "declares no pooling type"),
        (model("r", "smollm2.gguf", task="rerank"), "task rerank needs a reranker GGUF"),
        (model("r", "tiny-bert.gguf", task="rerank"), "declares mean pooling and has no classifier head"),
        (model("e", "tiny-reranker.gguf", task="embed"), "pools by rank (a reranker): set task: rerank"),
        ({"name": "e", "sources": [{"hf": "llama2-7b"}], "task": "embed"}, "which reads GGUF files"),
        (model("e", "missing.gguf", task="embed"), "source not found"),
    ],
)
def test_a_pooled_model_the_worker_could_not_serve_is_refused_saying_why(
    models: Path, entry: dict[str, Any], refusal: str
) -> None:
    d = plan(models, "none", entry).decision(entry["name"])
    assert d.plan is None and d.refusal is not None and refusal in d.refusal, d.refusal


def test_the_default_config_serves_chat_and_embeddings_from_the_smollm2_package() -> None:
    config = load_config(REPO / "configs" / "default.yaml")
    report = plan_models(config, inventory_from_spec("none"))
    chat, embed = report.decision("smollm2-135m"), report.decision("smollm2-embed")
    assert chat.plan is not None and embed.plan is not None, (chat.refusal, embed.refusal)
    assert (chat.plan.task, embed.plan.task, embed.plan.pooling) == ("generate", "embed", "mean")
    assert chat.plan.source_path == embed.plan.source_path and embed.plan.n_gpu_layers == 0
    assert report.start_order == ["smollm2-135m", "smollm2-embed"]


# --- the adapter -----------------------------------------------------------------------------------------


def pooled_plan(**fields: Any) -> DeploymentPlan:
    base: dict[str, Any] = {"model": "e", "engine": EngineName.LLAMACPP, "source_path": Path("/m/e.gguf"),
                            "model_format": "gguf", "context_tokens": 512, "slots": 32}  # fmt: skip
    return DeploymentPlan.model_validate({**base, **fields})


def _after(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_an_embed_plan_launches_the_pooled_worker_with_its_settings() -> None:
    argv = LlamaCppAdapter(python="py").launch_spec(pooled_plan(task="embed", pooling="mean", matryoshka=True), 9).argv
    assert argv[:3] == ("py", "-m", "backends.llamacpp.worker")
    assert (_after(argv, "--task"), _after(argv, "--pooling"), _after(argv, "--ctx"), _after(argv, "--slots")) == (
        "embed", "mean", "512", "32")  # fmt: skip
    assert "--matryoshka" in argv and "--cache-type" not in argv
    rerank = LlamaCppAdapter(python="py").launch_spec(pooled_plan(task="rerank"), 9).argv
    assert _after(rerank, "--task") == "rerank" and "--pooling" not in rerank and "--matryoshka" not in rerank
    chat = LlamaCppAdapter(python="py").launch_spec(pooled_plan(), 9).argv
    assert "--task" not in chat and "--pooling" not in chat


def test_each_task_serves_only_its_own_kind_of_request() -> None:
    adapter = LlamaCppAdapter()
    embed = adapter.capabilities(pooled_plan(task="embed"))
    mrl = adapter.capabilities(pooled_plan(task="embed", matryoshka=True))
    rerank, chat = adapter.capabilities(pooled_plan(task="rerank")), adapter.capabilities(pooled_plan())
    assert embed.kinds == {RequestKind.EMBEDDING} and rerank.kinds == {RequestKind.RERANK}
    assert chat.kinds == {RequestKind.CHAT, RequestKind.COMPLETION}
    assert (embed.dimensions, mrl.dimensions, chat.dimensions) == (False, True, False)
    assert not (embed.tools or embed.logprobs or rerank.tools)
    public = embed.public()
    assert (public["embeddings"], public["chat"], public["rerank"]) == (True, False, False)
    assert rerank.public()["rerank"] and not chat.public()["embeddings"]
