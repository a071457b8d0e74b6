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
    return (
        len(shape) >= 2
        and name.endswith("weight")
        and "_norm.weight" not in name
        and "ssm_conv1d" not in name
    )


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
