"""Will a GGUF model fit a GPU under llama-server, with which flags, and how fast will it decode?

The memory model follows what llama-server allocates when it loads a model (`-lv 4` prints each
buffer), component by component:

- weights: every tensor of the offloaded layers and the output head; llama.cpp keeps `token_embd` in
  host memory (it is only ever read one row per token), and a model with tied embeddings gets a copy
  of it on the GPU as its output head;
- KV cache: for each layer with attention, K and V rows of the cache type (q8_0 stores 32 values in
  34 bytes, q4_0 in 18, f16 in 64) for each cell: the context rounded up to 256, or for
  sliding-window layers the window plus one micro-batch;
- recurrent state (Gated DeltaNet, Mamba): f32 conv and SSM state per sequence, whatever the context;
- compute buffer: the graph allocator's peak for one micro-batch of T = min(ctx, ubatch, batch)
  tokens: the attention masks (n_kv x T; f16 with flash attention, f32 without), the K x Q scores
  without flash attention, and T x the widest phase of a layer in f32 (feed-forward: 5 n_embd + 3
  n_ff values per token; attention and recurrent phases likewise, see `compute_bytes`). Measured
  against llama-server on this CPU for llama, gemma3 and qwen35 shapes (tests/test_planner.py);
- what llama-server does not print: the CUDA context and library handles (per card, `rag/deploy/gpus.py`)
  and the CUDA pool, which on Volta holds one weight matrix dequantized to fp16 for prefill.

The decode ceiling is bandwidth / bytes read per token (the GPU weights, the KV cache at full
context, the recurrent state read and written); the realistic band scales it by the share of the
ceiling measured on real cards.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rag.deploy.gpus import GPU
from rag.deploy.model_shapes import BLOCK_SIZES, ModelSpec, TensorSpec
from rag.deploy.profiles import ServerProfile

MIB = 1024 * 1024
GIB = 1024 * MIB

UNITEMIZED = "output.unitemized"  # stands for bytes a published file has beyond its described tensors
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")

# --- reading a GGUF header ------------------------------------------------------------------------

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


# --- the architecture as the memory model needs it ------------------------------------------------


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


# --- what llama-server is asked to do --------------------------------------------------------------


@dataclass(frozen=True)
class Flags:
    """The llama-server flags that size its memory (the raw values: clamping is the planner's to show)."""

    ctx: int = 4096
    parallel: int = 1
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    batch: int = 2048
    ubatch: int = 512
    flash_attn: bool = True
    gpu_layers: int | None = None  # None: every layer and the output head
    kv_unified: bool = False
    swa_full: bool = False  # --swa-full: sliding-window layers get a full-size cache
    cache_ram_mib: int | None = None  # --cache-ram (host RAM only; None: llama-server's default)

    @property
    def n_ubatch(self) -> int:
        """llama.cpp uses min(batch, ubatch): a larger -ub is silently clamped."""
        return min(self.batch, self.ubatch)

    @property
    def n_ctx(self) -> int:
        return _pad(self.ctx, 256)

    @classmethod
    def from_profile(cls, profile: ServerProfile) -> "Flags":
        return cls(
            ctx=profile.ctx,
            parallel=profile.parallel,
            cache_type_k=profile.cache_type_k,
            cache_type_v=profile.cache_type_v,
            batch=profile.batch,
            ubatch=profile.ubatch,
            flash_attn=profile.flash_attn != "off",
            gpu_layers=profile.gpu_layers,
            swa_full="--swa-full" in profile.extra,
            cache_ram_mib=profile.cache_ram_mib,
        )

    @classmethod
    def from_server_args(cls, args: list[str]) -> "Flags":
        """The memory-sizing flags of a llama-server argument list (short spellings, as ServerProfile writes them)."""
        values = {a: b for a, b in zip(args, args[1:]) if a.startswith("-")}
        get = values.get
        return cls(ctx=int(get("-c", 4096)), parallel=int(get("-np", 1)), cache_type_k=get("-ctk", "f16"),
                   cache_type_v=get("-ctv", "f16"), batch=int(get("-b", 2048)), ubatch=int(get("-ub", 512)),
                   flash_attn=get("-fa", "auto") != "off", gpu_layers=int(get("-ngl", -1)) if "-ngl" in values else None,
                   swa_full="--swa-full" in args,
                   cache_ram_mib=int(get("--cache-ram")) if "--cache-ram" in values else None)

    def profile(self, name: str, description: str, model: str | None = None) -> ServerProfile:
        return ServerProfile(
            name=name,
            description=description,
            ctx=self.ctx,
            parallel=self.parallel,
            gpu_layers=999 if self.gpu_layers is None else self.gpu_layers,
            flash_attn="on" if self.flash_attn else "off",
            cache_type_k=self.cache_type_k,
            cache_type_v=self.cache_type_v,
            batch=self.batch,
            ubatch=self.n_ubatch,
            extra=("--swa-full",) if self.swa_full else (),
            cache_ram_mib=self.cache_ram_mib,
            model=model,
        )


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _type_bytes(type_name: str, n_values: int) -> int:
    block, size = BLOCK_SIZES[type_name.upper()]
    if n_values % block:
        raise ValueError(f"{n_values} values are not whole {type_name} blocks of {block}")
    return n_values // block * size


# --- memory ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """Bytes by component; `*_gpu` on the card, `*_host` in system memory."""

    weights_gpu: int
    weights_host: int
    kv: int
    recurrent: int
    compute: int
    pool: int = 0
    context: int = 0
    output_host: int = 0
    kv_host: int = 0

    @property
    def reported_gpu(self) -> int:
        """What llama-server's log lines add up to on the GPU (model + KV + RS + compute buffers)."""
        return self.weights_gpu + self.kv + self.recurrent + self.compute

    @property
    def total_gpu(self) -> int:
        return self.reported_gpu + self.pool + self.context


def weight_bytes(model: ModelSpec, arch: Architecture, gpu_layers: int | None) -> tuple[int, int, dict[str, int]]:
    """(bytes on the GPU, bytes in host memory, GPU bytes by tensor type)."""
    first_gpu_layer = arch.first_gpu_layer(gpu_layers)
    output_on_gpu = first_gpu_layer <= arch.n_layer_all
    on_gpu = on_host = 0
    by_type: dict[str, int] = {}
    for t in model.tensors:
        if t.name.startswith("blk."):
            layer = int(t.name.split(".")[1])
            if layer >= arch.n_layer:  # MTP/NextN blocks are not loaded unless drafting with them
                continue
            gpu = layer >= first_gpu_layer
        elif t.name in ("token_embd.weight", "per_layer_token_embd.weight", "token_types.weight"):
            gpu = False
        else:
            gpu = output_on_gpu
        if gpu:
            on_gpu += t.n_bytes
            kind = "unitemized" if t.name == UNITEMIZED else t.type_name
            by_type[kind] = by_type.get(kind, 0) + t.n_bytes
        else:
            on_host += t.n_bytes
    if arch.tied_output and output_on_gpu:
        embd = next(t for t in model.tensors if t.name == "token_embd.weight")
        on_gpu += embd.n_bytes  # the output head is a GPU copy of token_embd
        by_type[embd.type_name] = by_type.get(embd.type_name, 0) + embd.n_bytes
    return on_gpu, on_host, by_type


def kv_cells(arch: Architecture, flags: Flags) -> tuple[int, int]:
    """Cells of the full-attention cache and of the sliding-window cache (all streams together)."""
    n_seq = max(1, flags.parallel)
    if flags.kv_unified:
        per_stream, streams = flags.n_ctx, 1
    else:
        per_stream, streams = _pad(flags.n_ctx // n_seq, 256), n_seq
    swa = 0
    if arch.swa_layers:
        window = arch.n_swa * (n_seq if flags.kv_unified else 1) + flags.n_ubatch
        swa = per_stream if flags.swa_full else _pad(min(per_stream, window), 256)
    return per_stream * streams, swa * streams


def kv_bytes(arch: Architecture, flags: Flags, layers: tuple[int, ...] | None = None) -> int:
    full, swa = kv_cells(arch, flags)
    total = 0
    for il in arch.attention_layers if layers is None else layers:
        cells = swa if il in arch.swa_layers else full
        total += _type_bytes(flags.cache_type_k, cells * arch.n_head_kv[il] * arch.head_dim_k)
        total += _type_bytes(flags.cache_type_v, cells * arch.n_head_kv[il] * arch.head_dim_v)
    return total


def recurrent_bytes(arch: Architecture, flags: Flags, layers: tuple[int, ...] | None = None) -> int:
    chosen = arch.recurrent_layers if layers is None else layers
    return len(chosen) * max(1, flags.parallel) * (arch.conv_values + arch.ssm_values) * 4


def compute_bytes(arch: Architecture, flags: Flags) -> int:
    """The graph allocator's peak for one micro-batch (the pp graph llama.cpp reserves at start).

    Per token, in f32 values, the widest phase of a layer (fitted on llama-server's buffers):
    feed-forward 5 n_embd + 3 n_ff; attention 5 n_embd + q + kv with flash attention, n_embd + 5 q +
    2 kv without (plus the n_kv x T x n_head scores); Gated DeltaNet 5 n_embd + 2 conv + 2 inner
    (an upper estimate: on the shapes measured the feed-forward phase was the widest).
    """
    t = min(flags.n_ctx, flags.n_ubatch)
    full, swa = kv_cells(arch, flags)
    n_seq = max(1, flags.parallel)
    n_kv_full = full // (1 if flags.kv_unified else n_seq)
    n_kv_swa = swa // (1 if flags.kv_unified else n_seq)
    mask_elem = 2 if flags.flash_attn else 4
    masks = 0
    if any(il not in arch.swa_layers for il in arch.attention_layers):
        masks += n_kv_full * t * mask_elem
    if any(il in arch.swa_layers for il in arch.attention_layers):
        masks += n_kv_swa * t * mask_elem
    e = arch.n_embd
    phases = [t * (5 * e + 3 * arch.n_ff) * 4]
    if arch.attention_layers:
        q = max(arch.n_head[il] for il in arch.attention_layers) * arch.head_dim_k
        if arch.name in ("qwen35", "qwen35moe", "qwen3next"):
            q *= 2  # the query projection carries the output gate
        kv = max(arch.n_head_kv[il] for il in arch.attention_layers) * arch.head_dim_k
        if flags.flash_attn:
            phases.append(t * (5 * e + q + kv) * 4)
        else:
            n_kv = max(n_kv_full if any(il not in arch.swa_layers for il in arch.attention_layers) else 0, n_kv_swa)
            scores = n_kv * t * max(arch.n_head) * 4
            phases.append(scores + t * (e + 5 * q + 2 * kv) * 4)
    if arch.recurrent_layers:
        phases.append(t * (5 * e + 2 * arch.ssm_conv_dim + 2 * arch.ssm_d_inner) * 4)
    rotations = 0
    if flags.cache_type_k not in ("f16", "f32", "bf16"):
        rotations += arch.head_dim_k**2 * 4
    if flags.cache_type_v not in ("f16", "f32", "bf16"):
        rotations += arch.head_dim_v**2 * 4
    return masks + max(phases) + rotations + 64 * 1024


def pool_bytes(model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU) -> int:
    """The CUDA pool's high-water mark during prefill (not in llama-server's buffer lines)."""
    t = min(flags.n_ctx, flags.n_ubatch)
    pool = 0
    if flags.flash_attn and flags.cache_type_k not in ("f16", "bf16"):
        # quantized K/V are converted to f16 for a prompt batch, one layer at a time
        k, v = arch.n_head_kv[arch.attention_layers[0]] * arch.head_dim_k, arch.n_head_kv[arch.attention_layers[0]] * arch.head_dim_v
        full, _ = kv_cells(arch, flags)
        pool += full * (k + v) * 2 if arch.attention_layers else 0
    matrices = [m for m in model.tensors if len(m.shape) == 2 and m.name.startswith("blk.") and m.type_name not in ("F32", "F16", "BF16")]
    if gpu.dequantizes_for_prefill and matrices:
        pool += max(m.n_elements * 2 + m.shape[0] * t * 2 for m in matrices)  # fp16 weights and activations
    elif matrices:
        widest = max(t_.shape[0] for t_ in matrices)
        pool += widest * t * 36 // 32  # activations quantized to q8_1 for the quantized matmul
    return _pad(pool, 2 * MIB)


def estimate(model: ModelSpec, flags: Flags, gpu: GPU | None = None, arch: Architecture | None = None) -> Memory:
    """Memory by component for `flags`; `gpu=None` predicts a CPU-only load (everything on the host)."""
    arch = arch or architecture(model)
    output_host = arch.n_vocab * max(1, flags.parallel) * 4
    if gpu is None:
        on_gpu, on_host, _ = weight_bytes(model, arch, 0)
        return Memory(
            weights_gpu=on_gpu + on_host,
            weights_host=0,
            kv=kv_bytes(arch, flags),
            recurrent=recurrent_bytes(arch, flags),
            compute=compute_bytes(arch, flags),
            output_host=output_host,
        )
    on_gpu, on_host, _ = weight_bytes(model, arch, flags.gpu_layers)
    first = arch.first_gpu_layer(flags.gpu_layers)
    gpu_attn = tuple(il for il in arch.attention_layers if il >= first)
    gpu_recr = tuple(il for il in arch.recurrent_layers if il >= first)
    host_attn = tuple(il for il in arch.attention_layers if il < first)
    return Memory(
        weights_gpu=on_gpu,
        weights_host=on_host,
        kv=kv_bytes(arch, flags, gpu_attn),
        kv_host=kv_bytes(arch, flags, host_attn),
        recurrent=recurrent_bytes(arch, flags, gpu_recr),
        # token_embd lives in host memory, so the input embeddings of a micro-batch are computed there
        compute=compute_bytes(arch, flags) - arch.n_embd * min(flags.n_ctx, flags.n_ubatch) * 4,
        pool=pool_bytes(model, arch, flags, gpu),
        context=gpu.context_mib * MIB,
        output_host=output_host,
    )


# --- the plan -------------------------------------------------------------------------------------


def default_margin(gpu: GPU) -> int:
    """Free memory to keep: 512 MiB or 3% of the card, whichever is more."""
    return max(512 * MIB, gpu.memory_bytes * 3 // 100)


@dataclass(frozen=True)
class Speed:
    bytes_per_token: int
    ceiling: float
    low: float
    high: float
    source: str


@dataclass
class Plan:
    model: str
    gpu: GPU
    flags: Flags
    memory: Memory
    margin: int
    verdict: str  # "fits", "fits with flags", "does not fit"
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suggested: Flags | None = None
    speed: Speed | None = None
    weights_by_type: dict[str, int] = field(default_factory=dict)
    arch: Architecture | None = None

    @property
    def free(self) -> int:
        return self.gpu.memory_bytes - self.memory.total_gpu

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def server_args(self, model_path: str = "model.gguf", host: str = "127.0.0.1", port: int = 8080) -> list[str]:
        flags = self.suggested or self.flags
        return flags.profile("plan", "planned").command("llama-server", model_path, host, port)

    def to_dict(self) -> dict[str, Any]:
        m = self.memory
        out: dict[str, Any] = {
            "model": self.model,
            "gpu": {"name": self.gpu.name, "label": self.gpu.label, "memory_mib": self.gpu.memory_mib,
                    "bandwidth_gbs": self.gpu.bandwidth_gbs},
            "flags": {**self.flags.__dict__, "n_ubatch": self.flags.n_ubatch, "n_ctx": self.flags.n_ctx},
            "memory_mib": {
                "weights_gpu": m.weights_gpu / MIB, "weights_host": m.weights_host / MIB, "kv": m.kv / MIB,
                "recurrent": m.recurrent / MIB, "compute": m.compute / MIB, "cuda_pool": m.pool / MIB,
                "cuda_context": m.context / MIB, "reported_by_llama_server": m.reported_gpu / MIB,
                "total_gpu": m.total_gpu / MIB, "card": self.gpu.memory_mib, "free": self.free / MIB,
                "margin": self.margin / MIB,
            },
            "weights_gpu_by_type_mib": {k: v / MIB for k, v in sorted(self.weights_by_type.items())},
            "verdict": self.verdict,
            "advice": self.advice,
            "notes": self.notes,
            "server_args": self.server_args()[1:],
        }
        if self.suggested:
            out["suggested_flags"] = self.suggested.__dict__
        if self.speed:
            s = self.speed
            out["decode_tok_s"] = {"ceiling": s.ceiling, "low": s.low, "high": s.high,
                                   "bytes_per_token": s.bytes_per_token, "source": s.source}
        if self.arch:
            a = self.arch
            out["architecture"] = {
                "name": a.name, "layers": a.n_layer, "n_embd": a.n_embd, "n_ff": a.n_ff, "n_vocab": a.n_vocab,
                "heads": max(a.n_head or (0,)), "kv_heads": max(a.n_head_kv or (0,)), "head_dim_k": a.head_dim_k,
                "head_dim_v": a.head_dim_v, "attention_layers": len(a.attention_layers),
                "recurrent_layers": len(a.recurrent_layers), "sliding_window_layers": len(a.swa_layers),
                "kv_bytes_per_token": {ct: kv_bytes_per_token(a, ct) for ct in ("f16", "q8_0", "q4_0")},
            }
        return out


def kv_bytes_per_token(arch: Architecture, cache_type: str) -> int:
    k, v = arch.kv_values_per_token()
    return _type_bytes(cache_type, k) + _type_bytes(cache_type, v)


def decode_speed(memory: Memory, arch: Architecture, flags: Flags, gpu: GPU) -> Speed:
    """Decode ceiling at a full context: every GPU weight, the whole KV cache and the state, once a token."""
    per_token = memory.weights_gpu + memory.kv + 2 * memory.recurrent // max(1, flags.parallel)
    ceiling = gpu.bandwidth_gbs * 1e9 / per_token
    low, high = gpu.efficiency
    return Speed(per_token, ceiling, ceiling * low, ceiling * high, gpu.efficiency_source)


def _check(model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU, margin: int) -> tuple[Memory, bool]:
    memory = estimate(model, flags, gpu, arch)
    return memory, gpu.memory_bytes - memory.total_gpu >= margin


def plan(model: ModelSpec, gpu: GPU, flags: Flags, margin: int | None = None, extra_weight_bytes: int = 0) -> Plan:
    """The verdict for `model` on `gpu` with `flags`, and what to change when it does not fit.

    `extra_weight_bytes` adds weights the tensor table does not show (a published file larger than
    the described mix), all on the GPU.
    """
    arch = architecture(model)
    margin = default_margin(gpu) if margin is None else margin
    model = _with_extra(model, extra_weight_bytes)
    memory, ok = _check(model, arch, flags, gpu, margin)
    _, _, by_type = weight_bytes(model, arch, flags.gpu_layers)
    notes = _notes(arch, flags, gpu)
    result = Plan(model.name, gpu, flags, memory, margin, "fits" if ok else "does not fit", notes=notes,
                  weights_by_type=by_type, arch=arch)
    if not ok:
        alternative = _fitting_flags(model, arch, flags, gpu, margin)
        if alternative is not None:
            result.verdict = "fits with flags"
            result.suggested = alternative
            result.advice.append("fits with " + " ".join(_flag_diff(flags, alternative)))
        else:
            result.advice += _what_to_change(model, arch, flags, gpu, margin, memory)
    final = result.suggested or flags
    final_memory = estimate(model, final, gpu, arch) if result.suggested else memory
    if arch.first_gpu_layer(final.gpu_layers) == 0:
        result.speed = decode_speed(final_memory, arch, final, gpu)
    return result


def _with_extra(model: ModelSpec, extra: int) -> ModelSpec:
    if extra <= 0:
        return model
    # one unnamed F32 tensor stands for the weights the tensor table does not itemize
    filler = TensorSpec(UNITEMIZED, (extra // 4,), "F32")
    return replace(model, tensors=model.tensors + (filler,))


def _notes(arch: Architecture, flags: Flags, gpu: GPU) -> list[str]:
    notes = []
    if flags.ubatch > flags.batch:
        notes.append(f"-ub {flags.ubatch} is clamped to -b {flags.batch}: llama.cpp uses min(batch, ubatch)")
    if not flags.flash_attn and flags.cache_type_v not in ("f16", "f32", "bf16"):
        notes.append("a quantized V cache needs flash attention: llama-server refuses to start with -fa off")
    if arch.n_expert:
        notes.append("mixture-of-experts model: the compute buffer estimate is not calibrated for it")
    if gpu.dequantizes_for_prefill:
        notes.append("Volta: prompt batches dequantize each weight matrix to fp16 (cuBLAS), counted in cuda_pool")
    if flags.parallel > 1 and not flags.kv_unified:
        notes.append(f"-c {flags.ctx} is split across {flags.parallel} slots: {flags.n_ctx // flags.parallel} tokens each")
    return notes


def _fitting_flags(model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU, margin: int) -> Flags | None:
    """The smallest change of memory-only flags (same context, same layers) that fits."""
    fa = replace(flags, flash_attn=True, ubatch=flags.n_ubatch)
    caches = [(flags.cache_type_k, flags.cache_type_v)] + [(c, c) for c in ("q8_0", "q4_0")]
    for k, v in caches:
        for ub in sorted({flags.n_ubatch, min(256, flags.n_ubatch), min(128, flags.n_ubatch)}, reverse=True):
            cand = replace(fa, cache_type_k=k, cache_type_v=v, ubatch=ub)
            if cand != flags and _check(model, arch, cand, gpu, margin)[1]:
                return cand
    return None


def _flag_diff(old: Flags, new: Flags) -> list[str]:
    out = []
    if new.flash_attn != old.flash_attn:
        out.append("-fa on")
    if new.cache_type_k != old.cache_type_k or new.cache_type_v != old.cache_type_v:
        out.append(f"-ctk {new.cache_type_k} -ctv {new.cache_type_v}")
    if new.n_ubatch != old.n_ubatch or new.batch != old.batch:
        out.append(f"-b {new.batch} -ub {new.n_ubatch}")
    return out


def _what_to_change(model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU, margin: int, memory: Memory) -> list[str]:
    over = memory.total_gpu + margin - gpu.memory_bytes
    weights = memory.weights_gpu
    advice = [f"needs {over / MIB:,.0f} MiB more than the card has (keeping {margin / MIB:,.0f} MiB free)"]
    if weights > over:
        advice.append(
            f"a smaller quantization: GPU weights at most {(weights - over) / GIB:.2f} GiB "
            f"(now {weights / GIB:.2f} GiB, {8 * weights / max(1, _gpu_params(model, arch)):.2f} bits/weight)"
        )
    lean = replace(flags, cache_type_k="q4_0", cache_type_v="q4_0", flash_attn=True, ubatch=min(128, flags.n_ubatch))
    for ctx in (flags.ctx // 2, flags.ctx // 4, 2048, 1024):
        if ctx < 512 or ctx >= flags.ctx:
            continue
        cand = replace(lean, ctx=ctx)
        if _check(model, arch, cand, gpu, margin)[1]:
            advice.append(f"a shorter context: -c {ctx} with -ctk q4_0 -ctv q4_0 -ub {cand.n_ubatch} fits")
            break
    for ngl in range(arch.n_layer_all, -1, -1):
        cand = replace(flags, gpu_layers=ngl)
        if _check(model, arch, cand, gpu, margin)[1]:
            host = estimate(model, cand, gpu, arch).weights_host
            advice.append(
                f"partial offload: -ngl {ngl} (the output head and the last {ngl - 1} of {arch.n_layer} layers) fits; "
                f"{host / GIB:.1f} GiB of weights stay in system memory and decode slows to its bandwidth for them"
            )
            break
    return advice


def _gpu_params(model: ModelSpec, arch: Architecture) -> int:
    return sum(t.n_elements for t in model.tensors if t.name != "token_embd.weight") + (
        next(t.n_elements for t in model.tensors if t.name == "token_embd.weight") if arch.tied_output else 0
    )


# --- the tuned profile ----------------------------------------------------------------------------


def tune(candidates: dict[str, ModelSpec], gpu: GPU, ctx: int, parallel: int = 1,
         extra_weight_bytes: dict[str, int] | None = None) -> tuple[str, Flags, Plan]:
    """The best-quality candidate (in the given order) that fits with every layer on the GPU.

    Flags: flash attention on (needed for a quantized V cache); a q8_0 K/V cache (its perplexity cost
    is within noise, it halves the cache and the KV bytes read per token, and the memory it saves
    goes to the margin), q4_0 only if q8_0 does not fit; -b = -ub = 512 (a larger micro-batch grows
    the compute buffer for little prefill gain with one slot); the context and slots as asked; no
    host-memory prompt cache (--cache-ram 0: saving the old prompt to host RAM delayed every new question's
    prefill by 390-650 ms on an H200 machine, and restoring it can cross conversations, llama.cpp #27148;
    the slot's own cache keeps reusing a repeated prefix).
    """
    extra = extra_weight_bytes or {}
    for name, model in candidates.items():
        for cache in ("q8_0", "q4_0"):
            flags = Flags(ctx=ctx, parallel=parallel, cache_type_k=cache, cache_type_v=cache, batch=512, ubatch=512,
                          flash_attn=True, gpu_layers=None, cache_ram_mib=0)
            result = plan(model, gpu, flags, extra_weight_bytes=extra.get(name, 0))
            if result.fits:
                return name, flags, result
    raise ValueError(f"no candidate fits {gpu.label} with a {ctx}-token context")
