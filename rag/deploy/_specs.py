"""Models described as data: each tensor's name, shape and ggml type, and the bytes a type takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# llama.cpp type name -> (values per block, bytes per block); the subset that shipped quants use.
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: name, shape in ggml order (ne0 first) and ggml type name."""

    name: str
    shape: tuple[int, ...]
    type_name: str

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        block, size = BLOCK_SIZES[self.type_name]
        return self.n_elements // block * size


@dataclass(frozen=True)
class ModelSpec:
    """A model as the planner reads it: GGUF metadata (scalars and small arrays) and tensors."""

    name: str
    metadata: dict[str, Any]
    tensors: tuple[TensorSpec, ...]
    vocab_size: int

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)
