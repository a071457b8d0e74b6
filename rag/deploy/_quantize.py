"""llama-quantize's type choice (src/llama-quant.cpp), ported for the mixes we use: which ggml type each
tensor of a dense model gets under a file type such as Q4_K_M."""

from __future__ import annotations

from collections.abc import Iterable

from rag.deploy._specs import BLOCK_SIZES

# llama-quantize's file types: the base type of each mix.
FTYPE_BASE = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "IQ4_XS": "IQ4_XS", "Q8_0": "Q8_0", "F16": "F16"}
FTYPE_ID = {"F16": 1, "Q8_0": 7, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_M": 17, "IQ4_XS": 30}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _quantizable(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ssm_conv1d" not in name


def quant_mix(
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
        if name == "output.weight":
            t = "Q8_0" if base == "Q8_0" else "Q6_K"
        elif name.endswith(("attn_v.weight", "attn_qkv.weight")):
            t = _attn_v_type(ftype, base, n_gqa, i_attn_v, n_attn_v)
            i_attn_v += 1
        elif "ffn_down" in name:
            layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
            t = _ffn_down_type(ftype, base, layer, n_layer, imatrix)
        yield name, shape, _fitting(t, shape)


def _attn_v_type(ftype: str, base: str, n_gqa: int, i: int, n: int) -> str:
    """The type of the i-th of n attention value (or fused qkv) tensors."""
    if ftype == "IQ4_XS" and n_gqa >= 4:
        return "Q5_K"
    if ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
        return "Q6_K"
    if ftype == "Q4_K_S" and i < 4:
        return "Q5_K"
    return base


def _ffn_down_type(ftype: str, base: str, layer: int, n_layer: int, imatrix: bool) -> str:
    """The type of a layer's feed-forward down projection."""
    if ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(layer, n_layer):
        return "Q6_K"
    if ftype == "Q4_K_S" and layer < n_layer // 8:
        return "Q5_K"
    if ftype == "IQ4_XS" and layer < n_layer // 8 and not imatrix:
        return "Q5_K"
    return base


def _fitting(t: str, shape: tuple[int, ...]) -> str:
    """`t`, or llama-quantize's fallback when the rows are not a whole number of its blocks."""
    if shape[0] % BLOCK_SIZES[t][0]:
        return {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}.get(t, "F16")
    return t
