"""Re-quantise a GGUF with llama.cpp's own quantizer (for speed runs only: requantising loses quality).

python -m bench.cpu_fix.quantize SRC.gguf DEST.gguf Q4_K_M
"""

from __future__ import annotations

import sys

import llama_cpp

FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q6_K": 18}  # llama_ftype (llama.h)


def main() -> None:
    src, dest, kind = sys.argv[1:4]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.allow_requantize = True
    params.nthread = 0
    rc = llama_cpp.llama_model_quantize(src.encode(), dest.encode(), params)
    if rc != 0:
        raise SystemExit(f"quantize failed: {rc}")


if __name__ == "__main__":
    main()
