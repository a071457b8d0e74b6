"""Models described as data, tensor by tensor, and synthetic GGUF files with their exact shapes.

The production model (Qwen3.6-27B, llama.cpp architecture `qwen35`) cannot be downloaded here, so the
planner sees it as its hyperparameters plus, for each quantization, the per-tensor types that
llama.cpp's `llama-quantize` picks (`src/llama-quant.cpp`, ported in `_quantize` for the types we ship). The
resulting file sizes are checked against the published ones in the tests.

`write_gguf` turns such a description into a loadable GGUF with random weights (valid fp16 scales,
so no NaN), for capacity and speed tests on real hardware without the real weights.

The specs (`_specs`), the llama-quantize port (`_quantize`) and the GGUF writer (`_gguf_writer`) have
modules of their own; their public names are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rag.deploy._gguf_writer import CHATML_TEMPLATE, write_gguf
from rag.deploy._quantize import FTYPE_BASE, FTYPE_ID, quant_mix
from rag.deploy._specs import BLOCK_SIZES, ModelSpec, TensorSpec

__all__ = [
    "BLOCK_SIZES",
    "CHATML_TEMPLATE",
    "FTYPE_BASE",
    "FTYPE_ID",
    "GIB",
    "PUBLISHED_GIB",
    "QWEN36_27B",
    "ModelSpec",
    "Qwen35Hparams",
    "TensorSpec",
    "llama_model",
    "published_extra_bytes",
    "qwen35_metadata",
    "qwen35_model",
    "write_gguf",
]

GIB = 1024**3

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


def _qwen35_layer_tensors(h: Qwen35Hparams, il: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"blk.{il}."
    out: list[tuple[str, tuple[int, ...]]] = [
        (p + "attn_norm.weight", (h.n_embd,)),
        (p + "post_attention_norm.weight", (h.n_embd,)),
    ]
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
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (h.n_embd, h.n_vocab))]
    for il in range(h.n_layer):
        shapes += _qwen35_layer_tensors(h, il)
    shapes += [("output_norm.weight", (h.n_embd,)), ("output.weight", (h.n_embd, h.n_vocab))]
    n_gqa = h.n_head // h.n_head_kv
    # Published IQ quants are made with an importance matrix, which keeps ffn_down at the base type.
    imatrix = ftype.startswith("IQ")
    tensors = tuple(TensorSpec(n, s, t) for n, s, t in quant_mix(shapes, ftype, h.n_layer, n_gqa, imatrix))
    return ModelSpec(f"{name}-{ftype}", qwen35_metadata(h, ftype), tensors, h.n_vocab)


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


def published_extra_bytes(model: ModelSpec, ftype: str) -> int:
    """Bytes by which the published file exceeds the llama-quantize mix (packagers' own choices)."""
    published = int(PUBLISHED_GIB[ftype] * GIB)
    return max(0, published - model.tensor_bytes)
