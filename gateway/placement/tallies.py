"""A checkpoint's tensor bytes by where an engine puts them (per block, the block's routed experts, the token
embedding, a vision encoder, everything else), from tensor names: the GGUF and safetensors layouts."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_HF_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
_HF_EMBEDDING = re.compile(r"(?:embed_tokens|wte|word_embeddings)\.weight$")
_HF_EXPERT = re.compile(r"\.experts\.")  # routed (`mlp.experts.N.`, `block_sparse_moe.experts.N.`), not `shared_expert`
_HF_VISION = re.compile(r"^(?:model\.)?(?:visual|vision_model|vision_tower|mlp1|multi_modal_projector)\.")
_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass
class HFTally:
    """A safetensors checkpoint's tensor bytes (float tensors as float16, as engines load them)."""

    layers: list[int]
    experts: list[int]
    embedding: int = 0
    vision: int = 0
    other: int = 0
    n_params: int = 0
    weights: int = 0
    file_bytes: int = 0

    def add(self, name: str, nbytes: int, params: int) -> None:
        """Count one tensor (`nbytes` as loaded, `params` weights) where it belongs."""
        self.weights += nbytes
        self.n_params += params
        match = _HF_LAYER.search(name)
        if _HF_VISION.match(name):
            self.vision += nbytes  # its `blocks.N` are the encoder's, not the text model's
        elif match and int(match.group(1)) < len(self.layers):
            self.layers[int(match.group(1))] += nbytes
            if _HF_EXPERT.search(name):
                self.experts[int(match.group(1))] += nbytes
        elif _HF_EMBEDDING.search(name):
            self.embedding += nbytes
        else:
            self.other += nbytes


@dataclass
class GGUFTally:
    """A GGUF's tensor bytes by where llama.cpp puts them: per block, token embedding, everything else."""

    layers: list[int]
    experts: list[int]
    embedding: int = 0
    other: int = 0
    n_params: int = 0
    weights: int = 0
    has_output: bool = False
    by_type: Counter[str] = field(default_factory=Counter)


def tally_gguf(readers: list[Any], n_layers: int) -> GGUFTally:
    """Sum the tensors of every file of a (possibly split) GGUF."""
    tally = GGUFTally(layers=[0] * n_layers, experts=[0] * n_layers)
    for reader in readers:
        for t in reader.tensors:
            nbytes = int(t.n_bytes)
            tally.weights += nbytes
            tally.n_params += int(t.n_elements)
            if len(t.shape) >= 2:
                tally.by_type[t.tensor_type.name] += nbytes
            match = _GGUF_LAYER.match(t.name)
            if match and int(match.group(1)) < n_layers:
                tally.layers[int(match.group(1))] += nbytes
                if "_exps" in t.name:  # ffn_{up,down,gate,gate_up}_exps: the routed experts, not the shared
                    tally.experts[int(match.group(1))] += nbytes
            elif t.name == "token_embd.weight":
                tally.embedding += nbytes
            else:
                tally.other += nbytes
                tally.has_output = tally.has_output or t.name == "output.weight"
    return tally
