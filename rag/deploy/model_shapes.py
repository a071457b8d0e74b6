"""Models described as data, tensor by tensor, and synthetic GGUF files with their exact shapes.

The production model (Qwen3.6-27B, llama.cpp architecture `qwen35`) cannot be downloaded here, so the
planner sees it as its hyperparameters plus, for each quantization, the per-tensor types that
llama.cpp's `llama-quantize` picks (`src/llama-quant.cpp`, ported below for the types we ship). The
resulting file sizes are checked against the published ones in the tests.

`write_gguf` turns such a description into a loadable GGUF with random weights (valid fp16 scales,
so no NaN), for capacity and speed tests on real hardware without the real weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

GIB = 1024**3

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


# --- the production model ----------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen35Hparams:
    """Hyperparameters of a dense `qwen35` model (Gated DeltaNet layers with periodic full attention)."""

    n_layer: int = 64
    n_embd: int = 5120
    n_ff: int = 17408
    n_vocab: int = 248_320
    n_head: int = 24
    n_head_kv: int = 4
    head_dim: int = 256
    full_attention_interval: int = 4
    ssm_d_conv: int = 4
    ssm_d_state: int = 128  # linear_key_head_dim (= linear_value_head_dim)
    ssm_n_group: int = 16  # linear_num_key_heads
    ssm_dt_rank: int = 48  # linear_num_value_heads
    context_length: int = 262_144
    rope_sections: tuple[int, int, int, int] = (11, 11, 10, 0)
    rms_eps: float = 1e-6
    rope_freq_base: float = 10_000_000.0

    @property
    def ssm_d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank

    def is_recurrent(self, il: int) -> bool:
        return (il + 1) % self.full_attention_interval != 0


# Qwen3.6-27B (same shapes as Qwen3.5-27B): 16 x (3 Gated DeltaNet + 1 full-attention) layers.
QWEN36_27B = Qwen35Hparams()

# Published sizes of Qwen3.5-27B GGUFs (one packager), GiB. The shapes match Qwen3.6-27B.
PUBLISHED_GIB: dict[str, float] = {
    "IQ4_XS": 13.95,
    "Q4_K_S": 14.69,
    "Q4_K_M": 15.59,
    "Q5_K_M": 18.26,
    "Q8_0": 26.63,
}

# llama-quantize's file types: the base type of each mix.
FTYPE_BASE = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "IQ4_XS": "IQ4_XS", "Q8_0": "Q8_0", "F16": "F16"}
FTYPE_ID = {"F16": 1, "Q8_0": 7, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_M": 17, "IQ4_XS": 30}


def _qwen35_layer_tensors(h: Qwen35Hparams, il: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"blk.{il}."
    out = [(p + "attn_norm.weight", (h.n_embd,)), (p + "post_attention_norm.weight", (h.n_embd,))]
    if h.is_recurrent(il):
        key_dim = h.ssm_d_state * h.ssm_n_group
        value_dim = h.ssm_d_state * h.ssm_dt_rank
        out += [
            (p + "attn_qkv.weight", (h.n_embd, key_dim * 2 + value_dim)),
            (p + "attn_gate.weight", (h.n_embd, value_dim)),
            (p + "ssm_conv1d.weight", (h.ssm_d_conv, key_dim * 2 + value_dim)),
            (p + "ssm_dt.bias", (h.ssm_dt_rank,)),
            (p + "ssm_a", (h.ssm_dt_rank,)),
            (p + "ssm_beta.weight", (h.n_embd, h.ssm_dt_rank)),
            (p + "ssm_alpha.weight", (h.n_embd, h.ssm_dt_rank)),
            (p + "ssm_norm.weight", (h.ssm_d_state,)),
            (p + "ssm_out.weight", (value_dim, h.n_embd)),
        ]
    else:
        out += [
            # The query projection carries the output gate too: 2 x n_head x head_dim rows.
            (p + "attn_q.weight", (h.n_embd, h.head_dim * h.n_head * 2)),
            (p + "attn_k.weight", (h.n_embd, h.head_dim * h.n_head_kv)),
            (p + "attn_v.weight", (h.n_embd, h.head_dim * h.n_head_kv)),
            (p + "attn_output.weight", (h.head_dim * h.n_head, h.n_embd)),
            (p + "attn_q_norm.weight", (h.head_dim,)),
            (p + "attn_k_norm.weight", (h.head_dim,)),
        ]
    out += [
        (p + "ffn_gate.weight", (h.n_embd, h.n_ff)),
        (p + "ffn_down.weight", (h.n_ff, h.n_embd)),
        (p + "ffn_up.weight", (h.n_embd, h.n_ff)),
    ]
    return out


def qwen35_metadata(h: Qwen35Hparams, ftype: str = "Q4_K_M") -> dict[str, Any]:
    a = "qwen35."
    return {
        "general.architecture": "qwen35",
        "general.file_type": FTYPE_ID.get(ftype, 0),
        a + "block_count": h.n_layer,
        a + "context_length": h.context_length,
        a + "embedding_length": h.n_embd,
        a + "feed_forward_length": h.n_ff,
        a + "attention.head_count": h.n_head,
        a + "attention.head_count_kv": h.n_head_kv,
        a + "attention.key_length": h.head_dim,
        a + "attention.value_length": h.head_dim,
        a + "attention.layer_norm_rms_epsilon": h.rms_eps,
        a + "rope.freq_base": h.rope_freq_base,
        a + "rope.dimension_count": h.head_dim // 4,
        a + "rope.dimension_sections": list(h.rope_sections),
        a + "ssm.conv_kernel": h.ssm_d_conv,
        a + "ssm.inner_size": h.ssm_d_inner,
        a + "ssm.state_size": h.ssm_d_state,
        a + "ssm.time_step_rank": h.ssm_dt_rank,
        a + "ssm.group_count": h.ssm_n_group,
        a + "full_attention_interval": h.full_attention_interval,
    }


def qwen35_model(h: Qwen35Hparams = QWEN36_27B, ftype: str = "Q4_K_M", name: str = "Qwen3.6-27B") -> ModelSpec:
    """The model as llama-quantize would write it for `ftype` (no MTP head, untied output)."""
    shapes = [("token_embd.weight", (h.n_embd, h.n_vocab))]
    for il in range(h.n_layer):
        shapes += _qwen35_layer_tensors(h, il)
    shapes += [("output_norm.weight", (h.n_embd,)), ("output.weight", (h.n_embd, h.n_vocab))]
    n_gqa = h.n_head // h.n_head_kv
    # Published IQ quants are made with an importance matrix, which keeps ffn_down at the base type.
    imatrix = ftype.startswith("IQ")
    tensors = tuple(TensorSpec(n, s, t) for n, s, t in _quant_mix(shapes, ftype, h.n_layer, n_gqa, imatrix))
    return ModelSpec(f"{name}-{ftype}", qwen35_metadata(h, ftype), tensors, h.n_vocab)


# --- llama-quantize's type choice (src/llama-quant.cpp), for the mixes we use ------------------


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _quantizable(name: str, shape: tuple[int, ...]) -> bool:
    return (
        len(shape) >= 2
        and name.endswith("weight")
        and "_norm.weight" not in name
        and "ssm_conv1d" not in name
    )


def _quant_mix(
    shapes: Iterable[tuple[str, tuple[int, ...]]], ftype: str, n_layer: int, n_gqa: int, imatrix: bool
) -> Iterable[tuple[str, tuple[int, ...], str]]:
    """Per-tensor types of a llama-quantize mix for a dense model."""
    shapes = list(shapes)
    base = FTYPE_BASE[ftype]
    n_attn_v = sum(1 for n, _ in shapes if n.endswith(("attn_v.weight", "attn_qkv.weight")))
    i_attn_v = 0
    for name, shape in shapes:
        if not _quantizable(name, shape):
            yield name, shape, "F32"
            continue
        t = base
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if name == "output.weight":
            t = "Q8_0" if base == "Q8_0" else "Q6_K"
        elif name == "token_embd.weight":
            t = base
        elif name.endswith(("attn_v.weight", "attn_qkv.weight")):
            if ftype == "IQ4_XS" and n_gqa >= 4:
                t = "Q5_K"
            elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i_attn_v, n_attn_v):
                t = "Q6_K"
            elif ftype == "Q4_K_S" and i_attn_v < 4:
                t = "Q5_K"
            i_attn_v += 1
        elif "ffn_down" in name:
            if ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(layer, n_layer):
                t = "Q6_K"
            elif ftype == "Q4_K_S" and layer < n_layer // 8:
                t = "Q5_K"
            elif ftype == "IQ4_XS" and layer < n_layer // 8 and not imatrix:
                t = "Q5_K"
        block = BLOCK_SIZES[t][0]
        if shape[0] % block:
            t = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}.get(t, "F16")
        yield name, shape, t


# --- small test models --------------------------------------------------------------------------


def llama_model(
    n_layer: int = 2,
    n_embd: int = 256,
    n_ff: int = 512,
    n_vocab: int = 4096,
    n_head: int = 4,
    n_head_kv: int = 2,
    weight_type: str = "F16",
    name: str = "tiny-llama",
) -> ModelSpec:
    """A small llama-architecture model (untied output)."""
    hd = n_embd // n_head
    shapes: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (n_embd, n_vocab), weight_type)]
    for il in range(n_layer):
        p = f"blk.{il}."
        shapes += [
            (p + "attn_norm.weight", (n_embd,), "F32"),
            (p + "attn_q.weight", (n_embd, hd * n_head), weight_type),
            (p + "attn_k.weight", (n_embd, hd * n_head_kv), weight_type),
            (p + "attn_v.weight", (n_embd, hd * n_head_kv), weight_type),
            (p + "attn_output.weight", (hd * n_head, n_embd), weight_type),
            (p + "ffn_norm.weight", (n_embd,), "F32"),
            (p + "ffn_gate.weight", (n_embd, n_ff), weight_type),
            (p + "ffn_down.weight", (n_ff, n_embd), weight_type),
            (p + "ffn_up.weight", (n_embd, n_ff), weight_type),
        ]
    shapes += [("output_norm.weight", (n_embd,), "F32"), ("output.weight", (n_embd, n_vocab), weight_type)]
    a = "llama."
    metadata = {
        "general.architecture": "llama",
        a + "block_count": n_layer,
        a + "context_length": 8192,
        a + "embedding_length": n_embd,
        a + "feed_forward_length": n_ff,
        a + "attention.head_count": n_head,
        a + "attention.head_count_kv": n_head_kv,
        a + "attention.layer_norm_rms_epsilon": 1e-5,
        a + "rope.dimension_count": hd,
        a + "rope.freq_base": 10000.0,
    }
    return ModelSpec(name, metadata, tuple(TensorSpec(*s) for s in shapes), n_vocab)


# --- writing a synthetic GGUF ---------------------------------------------------------------------

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


def published_extra_bytes(model: ModelSpec, ftype: str) -> int:
    """Bytes by which the published file exceeds the llama-quantize mix (packagers' own choices)."""
    published = int(PUBLISHED_GIB[ftype] * GIB)
    return max(0, published - model.tensor_bytes)
