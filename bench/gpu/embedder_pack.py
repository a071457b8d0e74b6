"""Pack a sentence-transformers model folder small enough to travel to the GPU machine, and unpack it there.

    python3 bench/gpu/embedder_pack.py pack MODEL_DIR OUT.tar      # here: 2-D weights as int8 per row
    python3 bench/gpu/embedder_pack.py unpack IN.tar MODEL_DIR     # there: restored as fp16 safetensors

The bundled all-MiniLM-L6-v2 is ~90 MB in fp32, over one transfer's limit; int8 with one scale per row is
~23 MB, and restored to fp16 it kept cosine >= 0.998 to the original's embeddings on SQuAD texts (the
embedder runs in fp16 on CUDA anyway).
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

WEIGHTS = "model.safetensors"


def quantize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    packed: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        w = w.astype(np.float32)
        if w.ndim == 2:
            scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
            scale[scale == 0] = 1.0
            packed[f"{name}::q"] = np.round(w / scale).astype(np.int8)
            packed[f"{name}::s"] = scale.astype(np.float32)
        else:
            packed[f"{name}::h"] = w.astype(np.float16)
    return packed


def restore(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    weights: dict[str, np.ndarray] = {}
    for key, value in packed.items():
        name, kind = key.rsplit("::", 1)
        if kind == "q":
            weights[name] = (value.astype(np.float32) * packed[f"{name}::s"]).astype(np.float16)
        elif kind == "h":
            weights[name] = value
    return weights


def pack(model_dir: Path, out: Path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **quantize(load_file(str(model_dir / WEIGHTS))))
    with tarfile.open(out, "w") as tar:
        for path in sorted(model_dir.rglob("*")):
            if path.is_file() and path.name != WEIGHTS and not path.name.startswith("."):
                tar.add(path, arcname=str(path.relative_to(model_dir)))
        info = tarfile.TarInfo("weights.npz")
        info.size = buffer.tell()
        buffer.seek(0)
        tar.addfile(info, buffer)


def unpack(archive: Path, model_dir: Path) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(model_dir, filter="data")
    npz = model_dir / "weights.npz"
    with np.load(npz) as data:
        save_file(restore({k: data[k] for k in data.files}), str(model_dir / WEIGHTS))
    npz.unlink()


if __name__ == "__main__":
    verb, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    {"pack": pack, "unpack": unpack}[verb](src, dst)
