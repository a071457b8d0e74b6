"""Writing a synthetic GGUF: a model described as data becomes a loadable file with random weights
(valid fp16 scales, so no NaN), for capacity and speed tests on real hardware without the real weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rag.deploy._specs import BLOCK_SIZES, ModelSpec, TensorSpec

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: specials, the 256 byte tokens, letters and words, then fillers."""
    tokens = list(_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3, 3, 3] + [6] * 256  # unknown, control x4, byte
    pieces = [chr(c) for c in range(33, 127)] + ["\u2581" + chr(c) for c in range(97, 123)]
    words = "the of and to in is that for it as with was on be by are this from at or an which not".split()
    pieces += ["\u2581" + w for w in words]
    for p in pieces:
        if len(tokens) < n_vocab:
            tokens.append(p)
            types.append(1)
    while len(tokens) < n_vocab:
        tokens.append(f"\u2581tok{len(tokens)}")
        types.append(1)
    scores = [0.0] * len(_SPECIALS) + [0.0] * 256 + [-float(i) for i in range(n_vocab - len(_SPECIALS) - 256)]
    return tokens[:n_vocab], scores[:n_vocab], types[:n_vocab]


def _block_pattern(type_name: str, n_blocks: int, rng: np.random.Generator) -> bytes:
    """`n_blocks` random blocks of a type, with every fp16 scale set to a small finite value."""
    block, size = BLOCK_SIZES[type_name]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    small = np.frombuffer(np.float16(2.0**-12).tobytes(), dtype=np.uint8)
    if type_name in ("Q4_K", "Q5_K"):  # fp16 d, fp16 dmin first
        raw[:, 0:2] = small
        raw[:, 2:4] = small
    elif type_name == "Q6_K":  # ql[128] qh[64] int8 scales[16], fp16 d last
        raw[:, 208:210] = small
    elif type_name in ("IQ4_XS", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q2_K", "Q3_K"):
        if type_name in ("Q2_K", "Q3_K"):
            raw[:, -2:] = small
        else:
            raw[:, 0:2] = small
    elif type_name in ("Q4_1", "Q5_1"):
        raw[:, 0:2] = small
        raw[:, 2:4] = small
    elif type_name in ("F16", "BF16", "F32"):
        dtype = {"F16": np.float16, "F32": np.float32}.get(type_name)
        n = n_blocks * size // (4 if type_name == "F32" else 2)
        if dtype is None:  # bf16: the top half of a float32
            vals = (rng.standard_normal(n).astype(np.float32) * 0.02).view(np.uint32) >> 16
            return vals.astype(np.uint16).tobytes()
        return (rng.standard_normal(n) * 0.02).astype(dtype).tobytes()
    return raw.tobytes()


def _small_tensor(spec: TensorSpec, rng: np.random.Generator) -> bytes:
    """Values for the unquantized small tensors: norms at one, decays negative, the rest small."""
    n = spec.n_elements
    if spec.name.endswith("norm.weight"):
        values = np.ones(n, dtype=np.float32)
    elif spec.name.endswith("ssm_a"):
        values = -np.exp(rng.uniform(-1.0, 1.0, n)).astype(np.float32)
    else:
        values = (rng.standard_normal(n) * 0.02).astype(np.float32)
    return values.astype(np.float32 if spec.type_name == "F32" else np.float16).tobytes()


def write_gguf(
    model: ModelSpec, path: str | Path, seed: int = 0, chunk_bytes: int = 64 << 20, sparse: bool = False
) -> Path:
    """Write `model` as a GGUF with random weights; large tensors repeat one random pattern per type.

    `sparse=True` leaves the large tensors as holes in the file (zeros, no disk used): enough for
    llama-server to load the model and size its buffers, not to run it meaningfully.
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    arch = model.metadata["general.architecture"]
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in model.metadata.items():
        if key == "general.architecture":
            continue
        _add_value(writer, key, value)
    tokens, scores, types = _vocab(model.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(_SPECIALS.index("<|im_end|>"))
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for spec in model.tensors:
        qtype = gguf.GGMLQuantizationType[spec.type_name]
        dtype = np.float32 if spec.type_name == "F32" else np.float16 if spec.type_name == "F16" else np.uint8
        writer.add_tensor_info(spec.name, _numpy_shape(spec), np.dtype(dtype), spec.n_bytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    alignment = writer.data_alignment
    assert writer.fout is not None  # open since write_header_to_file
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())
    patterns: dict[str, bytes] = {}
    for spec in model.tensors:
        if spec.n_elements < (1 << 16) and spec.type_name in ("F32", "F16"):
            fout.write(_small_tensor(spec, rng))
        elif sparse:
            fout.seek(spec.n_bytes, 1)
        else:
            if spec.type_name not in patterns:
                size = BLOCK_SIZES[spec.type_name][1]
                patterns[spec.type_name] = _block_pattern(spec.type_name, max(1, chunk_bytes // size), rng)
            pattern = patterns[spec.type_name]
            left = spec.n_bytes
            while left > 0:
                piece = pattern[: min(left, len(pattern))]
                fout.write(piece)
                left -= len(piece)
        fout.seek(-spec.n_bytes % alignment, 1)
    fout.truncate(fout.tell())  # extends the file over trailing holes
    writer.close()
    return path


def _numpy_shape(spec: TensorSpec) -> tuple[int, ...]:
    """The byte shape GGUFWriter wants for raw data: reversed ne, the first axis in bytes for quants."""
    block, size = BLOCK_SIZES[spec.type_name]
    ne = list(spec.shape)
    if spec.type_name in ("F32", "F16"):
        return tuple(reversed(ne))
    ne[0] = ne[0] // block * size
    return tuple(reversed(ne))


def _add_value(writer: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    else:
        raise TypeError(f"cannot write {key}={value!r} ({type(value).__name__})")
