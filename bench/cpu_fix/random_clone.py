"""A random-weight copy of a GGUF with the original's metadata, tensor names, shapes and quant types.

The real embedded model (98 MB) is too large to send to the GPU machine (64 MiB a call), and its speed
depends only on shapes and types. `skeleton` keeps the metadata (tokenizer, chat template, hyper-parameters)
in a tensor-free GGUF plus a JSON list of tensors (about 2 MB); `build` writes a GGUF of the same shape with
random weights: valid fp16 scales, random quantised values (a repeated tile of them, so the file
compresses to a few MB). Works for F32, F16, Q4_0, Q4_1 and Q8_0 tensors.

    python -m bench.cpu_fix.random_clone skeleton MODEL.gguf OUT_DIR
    python -m bench.cpu_fix.random_clone build OUT_DIR DEST.gguf
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

_HEADER = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture")
# bytes per block and weights per block of the block-quantised types we regenerate
_BLOCKS = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q8_0": (34, 32)}


def skeleton(src: Path, out: Path) -> None:
    reader = GGUFReader(src)
    out.mkdir(parents=True, exist_ok=True)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(out / "meta.gguf", arch)
    for key, field in reader.fields.items():
        if key in _HEADER:
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), field.types[0], sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    tensors = [{"name": t.name, "shape": [int(x) for x in t.shape], "type": t.tensor_type.name} for t in reader.tensors]
    (out / "tensors.json").write_text(json.dumps({"architecture": arch, "tensors": tensors}))


def _random_blocks(rng: np.random.Generator, kind: str, n_weights: int) -> np.ndarray[Any, Any]:
    size, per = _BLOCKS[kind]
    n_blocks = n_weights // per
    # 61 random blocks repeated: the speed is that of random weights, and the file compresses to a few MB
    # (so it can travel to the GPU machine); 61 is prime, so rows do not repeat in step with their length.
    tile = rng.integers(0, 256, size=(61, size), dtype=np.uint8)
    blocks = np.resize(tile, (n_blocks, size))
    scale = np.full(n_blocks, 0.004, dtype=np.float16).view(np.uint8).reshape(n_blocks, 2)
    blocks[:, 0:2] = scale
    if kind == "Q4_1":  # d, then m (the block's minimum)
        blocks[:, 2:4] = np.full(n_blocks, -0.03, dtype=np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks


def build(skel: Path, dest: Path, seed: int = 0) -> None:
    meta = GGUFReader(skel / "meta.gguf")
    spec = json.loads((skel / "tensors.json").read_text())
    writer = GGUFWriter(dest, spec["architecture"])
    for key, field in meta.fields.items():
        if key in _HEADER:
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), field.types[0], sub)
    rng = np.random.default_rng(seed)
    for t in spec["tensors"]:
        shape = t["shape"]  # GGUF order: shape[0] is the row length
        n = int(np.prod(shape))
        if t["type"] == "F32":
            data = (
                np.ones(shape[::-1], dtype=np.float32)
                if t["name"].endswith("norm.weight")
                else (rng.standard_normal(shape[::-1]).astype(np.float32) * 0.02)
            )
            writer.add_tensor(t["name"], data)
        elif t["type"] == "F16":
            writer.add_tensor(t["name"], (rng.standard_normal(shape[::-1]) * 0.02).astype(np.float16))
        else:
            blocks = _random_blocks(rng, t["type"], n).reshape(-1)
            rows = n // shape[0]
            writer.add_tensor(t["name"], blocks.reshape(rows, -1), raw_dtype=GGMLQuantizationType[t["type"]])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skeleton")
    s.add_argument("src", type=Path)
    s.add_argument("out", type=Path)
    b = sub.add_parser("build")
    b.add_argument("skel", type=Path)
    b.add_argument("dest", type=Path)
    b.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.cmd == "skeleton":
        skeleton(args.src, args.out)
    else:
        build(args.skel, args.dest, args.seed)


if __name__ == "__main__":
    _ = GGUFValueType  # re-exported for readers of field types
    main()
