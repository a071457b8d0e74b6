"""The architecture as the memory model needs it: layers, heads, attention kinds, recurrent state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rag.deploy._specs import ModelSpec


@dataclass(frozen=True)
class Architecture:
    """What the memory model needs from a model's hyperparameters."""

    name: str
    n_layer: int
    n_embd: int
    n_ff: int  # the widest feed-forward layer
    n_vocab: int
    head_dim_k: int
    head_dim_v: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    attention_layers: tuple[int, ...]
    swa_layers: frozenset[int] = frozenset()
    n_swa: int = 0
    recurrent_layers: tuple[int, ...] = ()
    conv_values: int = 0  # recurrent conv state per layer and sequence (f32 values)
    ssm_values: int = 0  # recurrent SSM state per layer and sequence
    ssm_d_inner: int = 0
    ssm_conv_dim: int = 0
    n_expert: int = 0
    tied_output: bool = False
    n_layer_all: int = 0  # with MTP/NextN blocks: what -ngl counts against

    def first_gpu_layer(self, gpu_layers: int | None) -> int:
        """llama.cpp offloads the output head first, then layers from the last one down."""
        n_gpu = self.n_layer_all + 1 if gpu_layers is None else max(0, gpu_layers)
        return max(self.n_layer_all + 1 - n_gpu, 0)

    def kv_values_per_token(self, layers: tuple[int, ...] | None = None) -> tuple[int, int]:
        """K and V values per token (per cell) over the attention layers."""
        chosen = self.attention_layers if layers is None else layers
        k = sum(self.n_head_kv[il] * self.head_dim_k for il in chosen)
        v = sum(self.n_head_kv[il] * self.head_dim_v for il in chosen)
        return k, v


def _per_layer(value: Any, n: int) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(int(v) for v in value[:n]) + (int(value[-1]),) * max(0, n - len(value))
    return (int(value),) * n


def architecture(model: ModelSpec) -> Architecture:
    """Read the hyperparameters llama.cpp uses to size its buffers."""
    md = model.metadata
    arch = str(md.get("general.architecture", "llama"))

    def key(name: str, default: Any = None) -> Any:
        return md.get(f"{arch}.{name}", default)

    n_nextn = int(key("nextn_predict_layers", 0) or 0)
    n_layer = int(key("block_count")) - n_nextn
    n_embd = int(key("embedding_length"))
    n_head = _per_layer(key("attention.head_count", 0), n_layer)
    n_head_kv = _per_layer(key("attention.head_count_kv", n_head[0] if n_head else 0), n_layer)
    first_head = next((h for h in n_head if h), 1)
    head_k = int(key("attention.key_length", n_embd // first_head))
    head_v = int(key("attention.value_length", head_k))
    n_ff = max(_per_layer(key("feed_forward_length", 0), n_layer) or (0,))
    embd = next((t for t in model.tensors if t.name == "token_embd.weight"), None)
    n_vocab = int(key("vocab_size", 0) or (embd.shape[1] if embd else model.vocab_size))

    recurrent = _recurrent_layers(md, arch, n_layer)
    attention = tuple(il for il in range(n_layer) if il not in recurrent and n_head_kv[il] > 0)
    n_swa = int(key("attention.sliding_window", 0) or 0)
    swa = _swa_layers(md, arch, n_layer) if n_swa else frozenset()
    d_conv = int(key("ssm.conv_kernel", 0) or 0)
    d_inner = int(key("ssm.inner_size", 0) or 0)
    d_state = int(key("ssm.state_size", 0) or 0)
    n_group = int(key("ssm.group_count", 0) or 0)
    conv_dim = d_inner + 2 * n_group * d_state
    return Architecture(
        name=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_vocab=n_vocab,
        head_dim_k=head_k,
        head_dim_v=head_v,
        n_head=n_head,
        n_head_kv=n_head_kv,
        attention_layers=attention,
        swa_layers=swa,
        n_swa=n_swa,
        recurrent_layers=tuple(sorted(recurrent)),
        conv_values=max(0, d_conv - 1) * conv_dim,
        ssm_values=d_state * d_inner,
        ssm_d_inner=d_inner,
        ssm_conv_dim=conv_dim if recurrent else 0,
        n_expert=int(key("expert_count", 0) or 0),
        tied_output=not any(t.name == "output.weight" for t in model.tensors),
        n_layer_all=n_layer + n_nextn,
    )


def _recurrent_layers(md: dict[str, Any], arch: str, n_layer: int) -> frozenset[int]:
    flags = md.get(f"{arch}.attention.recurrent_layers")
    if isinstance(flags, list):
        return frozenset(il for il, f in enumerate(flags[:n_layer]) if f)
    interval = md.get(f"{arch}.full_attention_interval")
    if interval is None and arch in ("qwen3next", "qwen35", "qwen35moe"):
        interval = 4
    if interval:
        return frozenset(il for il in range(n_layer) if (il + 1) % int(interval) != 0)
    if arch.startswith("mamba") or arch == "rwkv6":
        return frozenset(range(n_layer))
    return frozenset()


# llama.cpp's default sliding-window patterns (n: every n-th layer is global) where the file has none.
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "llama4": 4}


def _swa_layers(md: dict[str, Any], arch: str, n_layer: int) -> frozenset[int]:
    pattern = md.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return frozenset(il for il, f in enumerate(pattern[:n_layer]) if f)
    n = int(pattern) if pattern is not None else _SWA_PATTERN.get(arch, 0)
    if not n:
        return frozenset(range(n_layer))
    return frozenset(il for il in range(n_layer) if il % n < n - 1)
