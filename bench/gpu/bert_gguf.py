"""A random-weight BERT GGUF of a real encoder's shape (default bge-base / BERT-base: 12 layers, 768 wide, 12
heads, FFN 3072, 512 positions, 30,522-token vocabulary), for embedding throughput on the GPU (issue #13).

It is tests/fixtures/tiny_bert.py's writer at other dimensions: the same tensors llama.cpp's BERT loader asks
for and the same WordPiece vocabulary, padded with filler pieces to the real vocabulary size (so the token
embedding and its memory are real-sized; every input word still tokenizes as in the tiny file). Matrices are
float16; norms, biases and the type/position embeddings float32, as llama.cpp's converter writes a BERT
(file type MOSTLY_F16).

    python3 -m bench.gpu.bert_gguf OUT.gguf [--layers 12 --hidden 768 --heads 12 --ffn 3072 --vocab 30522]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

from tests.fixtures import tiny_bert


def write_bert(path: Path, *, layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072,
               vocab: int = 30522, positions: int = 512, pooling: str = "cls") -> Path:  # fmt: skip
    base = tiny_bert.vocabulary()
    if vocab < len(base):
        raise ValueError(f"vocab must be at least {len(base)}")
    tokens = base + [f"\u2581filler{i}" for i in range(vocab - len(base))]
    saved = {k: getattr(tiny_bert, k) for k in ("N_EMBD", "N_HEAD", "N_FF", "N_LAYER", "N_CTX_TRAIN")}
    saved_vocab, saved_normal, saved_writer = tiny_bert.vocabulary, tiny_bert._normal, gguf.GGUFWriter

    def normal(rng: np.random.Generator, *shape: int, std: float = 0.08) -> np.ndarray:
        # std shrunk with width so activations stay finite through 12 random layers
        scale = min(1.0, (64 / hidden) ** 0.5) if len(shape) == 2 else 1.0
        out = rng.standard_normal(shape, dtype=np.float32) * std * scale
        return out.astype(np.float16) if len(shape) == 2 else out

    class Writer(gguf.GGUFWriter):
        def add_file_type(self, ftype: int) -> None:  # noqa: ARG002
            super().add_file_type(gguf.LlamaFileType.MOSTLY_F16)

        def add_tensor(self, name: str, tensor: np.ndarray, *a: object, **k: object) -> None:
            # llama.cpp adds the token-type row straight to f32 activations: keep it (and positions) f32
            if name in ("token_types.weight", "position_embd.weight"):
                tensor = tensor.astype(np.float32)
            super().add_tensor(name, tensor, *a, **k)  # type: ignore[arg-type]

    tiny_bert.N_EMBD, tiny_bert.N_HEAD, tiny_bert.N_FF, tiny_bert.N_LAYER = hidden, heads, ffn, layers
    tiny_bert.N_CTX_TRAIN = positions
    tiny_bert.vocabulary = lambda: tokens
    tiny_bert._normal = normal
    gguf.GGUFWriter = Writer  # type: ignore[misc]
    try:
        return tiny_bert.write_tiny_bert(path, pooling=pooling)
    finally:
        for k, v in saved.items():
            setattr(tiny_bert, k, v)
        tiny_bert.vocabulary, tiny_bert._normal = saved_vocab, saved_normal
        gguf.GGUFWriter = saved_writer  # type: ignore[misc]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.gpu.bert_gguf", description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--positions", type=int, default=512)
    p.add_argument("--pooling", default="cls", choices=["mean", "cls"])
    a = p.parse_args(argv)
    write_bert(a.out, layers=a.layers, hidden=a.hidden, heads=a.heads, ffn=a.ffn, vocab=a.vocab,
               positions=a.positions, pooling=a.pooling)  # fmt: skip
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
