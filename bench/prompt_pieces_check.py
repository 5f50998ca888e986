"""Does a prompt cut before special tokens tokenize as the whole prompt does, on llama.cpp's own test
vocabularies? (`backends/llamacpp/worker/prompt_tokens.py`; the worker tokenizes agent sessions in pieces.)

For each `ggml-vocab-*.gguf` in a folder (llama.cpp's `models/`: 19 vocabularies of SPM, BPE, WPM and UGM
kinds, with `.inp` files of hard strings), the vocabulary alone is loaded; texts are made at random from the
`.inp` strings, every special token's text, pieces of those texts, and whitespace runs; each is tokenized whole
and in pieces cut before *every* safe special token (the worker cuts only before a template's message markers: a
stricter test). A vocabulary that is not cuttable (WPM, UGM, or one appending EOS) is listed as tokenized whole.

    python -m bench.prompt_pieces_check FOLDER --texts 2000 --out bench/results/<run>/prompt-pieces.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from backends.llamacpp.worker import native
from backends.llamacpp.worker.prompt_tokens import SHORT_TEXT, PieceTokenizer, safe_anchors

WHITESPACE = (" ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "   \n  ")


def _inputs(path: Path) -> list[str]:
    inp = path.with_name(path.name + ".inp")
    if not inp.exists():
        return ["Hello world", " Hello", "ied 4 ½ months", "Äpfel", "🦙🦙 3333"]
    return [s.strip("\n") for s in inp.read_text("utf-8").split("__ggml_vocab_test__") if s.strip("\n")]


def _text(rng: random.Random, inputs: list[str], specials: list[str]) -> str:
    parts: list[str] = []
    while sum(map(len, parts)) < SHORT_TEXT + rng.randrange(2000):
        roll = rng.random()
        if roll < 0.3 and specials:
            parts.append(rng.choice(specials))
        elif roll < 0.4 and specials:  # a piece of a special token's text
            s = rng.choice(specials)
            i = rng.randrange(len(s) + 1)
            parts.append(s[:i] if rng.random() < 0.5 else s[i:])
        elif roll < 0.6:
            parts.append(rng.choice(WHITESPACE))
        else:
            parts.append(rng.choice(inputs))
    return "".join(parts)


def check(path: Path, n_texts: int, seed: int) -> dict[str, Any]:
    model = native.load_vocab(path)
    try:
        vocab = native.lib.llama_model_get_vocab(model)
        specials = native.vocab_specials(vocab)
        row: dict[str, Any] = {"vocab": path.name, "type": int(native.lib.llama_vocab_type(vocab))}
        row["specials"] = len(specials)
        if not native.vocab_cuttable(vocab):
            return row | {"cuttable": False}
        anchors = safe_anchors(specials.values(), list(specials.values()))
        row |= {
            "cuttable": True,
            "anchors": len(anchors),
            "unsafe": len({s.text for s in specials.values()}) - len(anchors),
        }

        def whole(text: str, add_special: bool) -> list[int]:
            return native.tokenize(vocab, text, add_special=add_special)

        rng = random.Random(seed)
        texts = [s.text for s in specials.values() if s.text]
        common = [t for t in texts if not t.startswith(("<unused", "[unused", "<|reserved", "<extra_id"))][:200]
        inputs = _inputs(path)
        wrong: list[str] = []
        cuts = 0
        for _ in range(n_texts):
            text = _text(rng, inputs, common)
            pieces = PieceTokenizer(whole, anchors)  # fresh: no piece from another text
            add = rng.random() < 0.5
            if pieces(text, add) != whole(text, add):
                wrong.append(text)
            cuts += pieces.tokenized > 0
        return row | {"texts": n_texts, "cut": cuts, "different": len(wrong), "first_different": wrong[:3]}
    finally:
        native.lib.llama_model_free(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.time()
    rows = [check(p, args.texts, args.seed) for p in sorted(args.folder.glob("ggml-vocab-*.gguf"))]
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "first_different"}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"seconds": round(time.time() - started, 1), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
