"""Where `rag up` runs the embedding server: on the GPU only when the planner leaves it room beside llama-server.

On a V100 16 GB the shipped profile leaves about 0.9 GiB free (measured 940 MiB on an H200 held to 16,160 MiB),
while the embedding server on CUDA took 570-988 MiB there with the small all-MiniLM-L6-v2 alone (its CUDA
context, cuBLAS and activations). So the embedder goes to the CUDA device only when the planner's free memory,
less its margin for llama-server, holds the embedder's fp16 weights plus that measured overhead.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from rag.core.config import Settings
from rag.deploy.gpus import GPUS
from rag.deploy.model_shapes import ModelSpec
from rag.deploy.planner import MIB, Flags, GGUFFormatError, default_margin, plan, read_gguf
from rag.deploy.profiles import get_profile

# The embedding server's CUDA memory beyond its weights: the top of the 570-988 MiB measured on an H200.
EMBEDDER_CUDA_OVERHEAD = 988 * MIB
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


@dataclass(frozen=True)
class Placement:
    """The embedder's device (None: the embedding server's own choice) and why."""

    device: str | None
    reason: str


def embedder_weight_bytes(model_dir: Path) -> int:
    """The model's weights in fp16 (the server's dtype on CUDA); files on disk are taken to be fp32."""
    files = [p for p in model_dir.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file()]
    return sum(p.stat().st_size for p in files) // 2


def readable_gguf(path: Path) -> ModelSpec | None:
    """The GGUF's header for the planner, or None when it cannot be read."""
    try:
        return read_gguf(path)
    except (GGUFFormatError, ValueError, KeyError, OSError, struct.error):
        return None


def embedder_placement(settings: Settings, generator: ModelSpec | Path | None) -> Placement:
    """The embedder's device for `rag up`, given the GGUF llama-server will serve (its path or its header)."""
    if settings.embed_device:
        return Placement(settings.embed_device, "RAG_EMBED_DEVICE")
    profile = get_profile(settings.llm_profile)
    if profile.gpu_layers is None:
        return Placement(None, f"CUDA if there is one, else the CPU: profile {profile.name} leaves any GPU free")
    gpu = GPUS.get(profile.name)
    if isinstance(generator, Path):
        generator = readable_gguf(generator)
    if gpu is None or generator is None:
        return Placement("cpu", f"the planner cannot size profile {profile.name} on its GPU")
    room = plan(generator, gpu, Flags.from_profile(profile)).free - default_margin(gpu)
    need = embedder_weight_bytes(settings.embed_model_dir) + EMBEDDER_CUDA_OVERHEAD
    summary = (
        f"{max(room, 0) / MIB:,.0f} MiB spare beside llama-server on {gpu.label}, embedder needs {need / MIB:,.0f}"
    )
    return Placement("cuda" if room >= need else "cpu", summary)
