"""Reading a GGUF header: the metadata and the tensor table, without the weights (mmap, no copy)."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from rag.deploy._specs import BLOCK_SIZES, ModelSpec, TensorSpec

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 4096  # keep per-layer arrays; skip vocabularies (GGUFReader builds a view per string: 15 s)


class GGUFFormatError(ValueError):
    """The file is not a GGUF this planner can read."""


def read_gguf(path: str | Path) -> ModelSpec:
    """Metadata and tensor table of a GGUF file, without touching tensor data."""
    import gguf

    path = Path(path)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise GGUFFormatError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise GGUFFormatError(f"{path}: GGUF version {version} is not supported")
        pos = 24
        metadata: dict[str, Any] = {}
        array_lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key, pos = _read_str(buf, pos)
            (vtype,) = struct.unpack_from("<I", buf, pos)
            value, pos, length = _read_value(buf, pos + 4, vtype)
            if length is not None:
                array_lengths[key] = length
            if value is not None:
                metadata[key] = value
        tensors = []
        for _ in range(n_tensors):
            name, pos = _read_str(buf, pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            type_id, _offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            type_name = gguf.GGMLQuantizationType(type_id).name
            if type_name not in BLOCK_SIZES:
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
                BLOCK_SIZES[type_name] = (block, size)
            tensors.append(TensorSpec(name, tuple(int(d) for d in shape), type_name))
    if not tensors:
        raise GGUFFormatError(
            f"{path.name} holds no tensors (a vocabulary-only GGUF, like llama.cpp's "
            "models/ggml-vocab-*.gguf): there is no model to plan"
        )
    if not any(t.name == "token_embd.weight" for t in tensors):
        raise GGUFFormatError(f"{path.name} has no token_embd.weight tensor: not a language model the planner knows")
    vocab = array_lengths.get("tokenizer.ggml.tokens", 0)
    name = str(metadata.get("general.name") or path.stem)
    return ModelSpec(name, metadata, tuple(tensors), vocab)


def _read_str(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8 : pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n


def _read_value(buf: mmap.mmap, pos: int, vtype: int) -> tuple[Any, int, int | None]:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt), None
    if vtype == _STRING:
        value, pos = _read_str(buf, pos)
        return value, pos, None
    if vtype != _ARRAY:
        raise GGUFFormatError(f"unknown GGUF value type {vtype}")
    etype, n = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _SCALARS:
        size = struct.calcsize(_SCALARS[etype])
        if n > _KEEP_ARRAY:
            return None, pos + n * size, n
        values = list(struct.unpack_from(f"<{n}{_SCALARS[etype][1]}", buf, pos))
        return values, pos + n * size, n
    if etype == _STRING:
        if n > _KEEP_ARRAY:
            for _ in range(n):  # only the lengths are read
                (k,) = struct.unpack_from("<Q", buf, pos)
                pos += 8 + k
            return None, pos, n
        values = []
        for _ in range(n):
            value, pos = _read_str(buf, pos)
            values.append(value)
        return values, pos, n
    raise GGUFFormatError(f"nested GGUF arrays (type {etype}) are not supported")
