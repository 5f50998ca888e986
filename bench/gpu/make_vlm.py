"""A random-weight Qwen2-VL in Hugging Face format, for TurboMind's vision path on the GPU machine (no downloads).

    python3 -m bench.gpu.make_vlm OUT [--shape 2b|2.5-3b|small]

`2b` is Qwen2-VL-2B-Instruct's shape exactly (text: 28 layers, hidden 1536, 12 heads of 128, 2 KV heads, FFN
8960, M-RoPE sections 16/24/24, tied embeddings; vision: 32 ViT blocks, width 1280, 16 heads of 80, MLP 5120,
14-pixel patches, 2x2 merge into the text width) except the vocabulary: a synthetic 32,000-piece unigram
tokenizer plus Qwen2-VL's special tokens (32,064 rows). `2.5-3b` is Qwen2.5-VL-3B-Instruct's (text: 36 layers,
hidden 2048, 16 heads of 128, 2 KV heads, FFN 11008; vision: 32 blocks of width 1280 with RMSNorm, a gated
MLP of 3420, window attention of 112 pixels with full attention in blocks 7/15/23/31), same vocabulary.
`small` keeps every width and head size of `2b` and has 2 text layers and 2 ViT blocks (a CPU check). The
checkpoint uses Qwen2-VL's original tensor names and config layout (`visual.*`, `model.layers.*`, the text
fields at the top of config.json), which is what LMDeploy 0.18's TurboMind loader reads
(lmdeploy/turbomind/models/qwen2_vl.py). Weights: std 0.02, norms 1, biases 0; drawn with torch on the GPU
when there is one, else with numpy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

NORMAL_VOCAB = 32_000
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")  # fmt: skip
VOCAB_ROWS = 32_064
TEXT: dict[str, dict[str, int]] = {
    "2b": dict(num_hidden_layers=28, hidden_size=1536, intermediate_size=8960, num_attention_heads=12),
    "2.5-3b": dict(num_hidden_layers=36, hidden_size=2048, intermediate_size=11008, num_attention_heads=16),
    "small": dict(num_hidden_layers=2, hidden_size=1536, intermediate_size=8960, num_attention_heads=12),
}
QWEN2_VISION = {"embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3, "hidden_size": 1536,
                "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
QWEN2_5_VISION = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                  "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                  "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                  "hidden_act": "silu", "model_type": "qwen2_5_vl"}  # fmt: skip
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] in "
    "['image', 'image_url'] %}<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def special_id(token: str) -> int:
    return NORMAL_VOCAB + SPECIALS.index(token)


def config(shape: str) -> dict[str, Any]:
    """config.json in Qwen2-VL-2B-Instruct's (Qwen2.5-VL-3B-Instruct's) layout: text fields at the top,
    `vision_config` nested."""
    qwen2_5 = shape.startswith("2.5")
    vision = QWEN2_5_VISION if qwen2_5 else {**QWEN2_VISION, "depth": 2 if shape == "small" else 32}
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration" if qwen2_5 else "Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl" if qwen2_5 else "qwen2_vl",
        "attention_dropout": 0.0,
        "bos_token_id": special_id("<|endoftext|>"),
        "eos_token_id": special_id("<|im_end|>"),
        "vision_start_token_id": special_id("<|vision_start|>"),
        "vision_end_token_id": special_id("<|vision_end|>"),
        "vision_token_id": special_id("<|vision_pad|>"),
        "image_token_id": special_id("<|image_pad|>"),
        "video_token_id": special_id("<|video_pad|>"),
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 128000 if qwen2_5 else 32768,
        "max_window_layers": TEXT[shape]["num_hidden_layers"],
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "use_cache": True,
        "use_sliding_window": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vocab_size": VOCAB_ROWS,
        "vision_config": vision,
        **TEXT[shape],
    }


def tensor_shapes(c: dict[str, Any]) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of the checkpoint with Qwen2-VL's original names (tied embeddings: no lm_head)."""
    v = c["vision_config"]
    gated = "intermediate_size" in v  # Qwen2.5-VL: RMSNorm (no biases) and a gated MLP
    e = v.get("embed_dim", v["hidden_size"])
    mlp = v["intermediate_size"] if gated else e * v["mlp_ratio"]
    merged = e * v["spatial_merge_size"] ** 2
    patch = (e, v["in_chans"], v["temporal_patch_size"], v["patch_size"], v["patch_size"])
    yield "visual.patch_embed.proj.weight", patch
    ffn = [("gate_proj", mlp, e), ("up_proj", mlp, e), ("down_proj", e, mlp)] if gated else [
        ("fc1", mlp, e), ("fc2", e, mlp)]  # fmt: skip
    for i in range(v["depth"]):
        p = f"visual.blocks.{i}."
        for norm in ("norm1", "norm2"):
            yield p + norm + ".weight", (e,)
            if not gated:
                yield p + norm + ".bias", (e,)
        yield p + "attn.qkv.weight", (3 * e, e)
        yield p + "attn.qkv.bias", (3 * e,)
        yield p + "attn.proj.weight", (e, e)
        yield p + "attn.proj.bias", (e,)
        for name, rows, cols in ffn:
            yield p + f"mlp.{name}.weight", (rows, cols)
            yield p + f"mlp.{name}.bias", (rows,)
    yield "visual.merger.ln_q.weight", (e,)
    if not gated:
        yield "visual.merger.ln_q.bias", (e,)
    yield "visual.merger.mlp.0.weight", (merged, merged)
    yield "visual.merger.mlp.0.bias", (merged,)
    yield "visual.merger.mlp.2.weight", (c["hidden_size"], merged)
    yield "visual.merger.mlp.2.bias", (c["hidden_size"],)
    h, f = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    yield "model.embed_tokens.weight", (c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        for proj, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{proj}.weight", (rows, h)
            yield p + f"self_attn.{proj}.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (h, h)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (f, h)
        yield p + "mlp.up_proj.weight", (f, h)
        yield p + "mlp.down_proj.weight", (h, f)
    yield "model.norm.weight", (h,)


def random_fp16(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    is_norm = any(k in name for k in ("norm", "ln_q"))
    if name.endswith(".bias"):
        return np.zeros(shape, np.float16)
    if is_norm:
        return np.ones(shape, np.float16)
    try:
        import torch

        if torch.cuda.is_available():
            g = torch.Generator(device="cuda").manual_seed(seed)
            drawn: np.ndarray = (
                (torch.randn(shape, generator=g, device="cuda", dtype=torch.float16) * 0.02).cpu().numpy()
            )
            return drawn
    except ImportError:
        pass
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)


def write_weights(out: Path, c: dict[str, Any]) -> int:
    """One safetensors file per ~4 GiB plus the index; returns the bytes written."""
    from safetensors.numpy import save_file

    shards: list[list[tuple[int, str, tuple[int, ...]]]] = [[]]
    size = 0
    for seed, (name, shape) in enumerate(tensor_shapes(c)):
        nbytes = 2 * int(np.prod(shape))
        if shards[-1] and size + nbytes > 4 << 30:
            shards.append([])
            size = 0
        shards[-1].append((seed, name, shape))
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(shards):
        filename = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: random_fp16(name, shape, seed) for seed, name, shape in shard}
        save_file(tensors, str(out / filename), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, filename)
        total += sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return total


def pieces() -> list[tuple[str, float]]:
    """A deterministic unigram vocabulary: `<unk>`, 256 byte pieces, then letters, digits and short words."""
    low = string.ascii_lowercase
    normal = ["\u2581", *string.ascii_letters, *string.digits, *string.punctuation]
    normal += ["\u2581" + ch for ch in string.ascii_letters + string.digits]
    for n in (2, 3):
        words = ["".join(p) for p in itertools.product(low, repeat=n)]
        normal += words + ["\u2581" + w for w in words]
    out = [("<unk>", 0.0)] + [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    need = NORMAL_VOCAB - len(out)
    out += [(p, -10.0 + 0.5 * len(p) - 1e-5 * i) for i, p in enumerate(normal[:need])]
    return out


def write_tokenizer(out: Path, processor: str = "Qwen2VLProcessor") -> None:
    """tokenizer.json (unigram, byte fallback, Qwen2-VL's special tokens after the 32,000 pieces), its config
    with a ChatML template like Qwen2-VL's, and the image processor's config (Qwen2-VL-2B-Instruct's values)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    tok = Tokenizer(models.Unigram(pieces(), unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "processor_class": processor,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=1))
    preprocessor = {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(TEXT), default="2b")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    c = config(args.shape)
    (args.out / "config.json").write_text(json.dumps(c, indent=1))
    gen = {"bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"], "do_sample": False}
    (args.out / "generation_config.json").write_text(json.dumps(gen))
    write_tokenizer(args.out, "Qwen2_5_VLProcessor" if args.shape.startswith("2.5") else "Qwen2VLProcessor")
    total = write_weights(args.out, c)
    print(f"{args.out}: Qwen2-VL {args.shape} shape, {total / 2 / 1e9:.3f} B params, {total / 1e9:.2f} GB fp16")


if __name__ == "__main__":
    main()
