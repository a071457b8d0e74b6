"""What llama-server allocates for a model under some flags, component by component (see `planner`)."""

from __future__ import annotations

from dataclasses import dataclass

from rag.deploy._architecture import Architecture, architecture
from rag.deploy._flags import MIB, Flags, pad
from rag.deploy._specs import BLOCK_SIZES, ModelSpec
from rag.deploy.gpus import GPU

UNITEMIZED = "output.unitemized"  # stands for bytes a published file has beyond its described tensors


def type_bytes(type_name: str, n_values: int) -> int:
    block, size = BLOCK_SIZES[type_name.upper()]
    if n_values % block:
        raise ValueError(f"{n_values} values are not whole {type_name} blocks of {block}")
    return n_values // block * size


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
        per_stream, streams = pad(flags.n_ctx // n_seq, 256), n_seq
    swa = 0
    if arch.swa_layers:
        window = arch.n_swa * (n_seq if flags.kv_unified else 1) + flags.n_ubatch
        swa = per_stream if flags.swa_full else pad(min(per_stream, window), 256)
    return per_stream * streams, swa * streams


def kv_bytes(arch: Architecture, flags: Flags, layers: tuple[int, ...] | None = None) -> int:
    full, swa = kv_cells(arch, flags)
    total = 0
    for il in arch.attention_layers if layers is None else layers:
        cells = swa if il in arch.swa_layers else full
        total += type_bytes(flags.cache_type_k, cells * arch.n_head_kv[il] * arch.head_dim_k)
        total += type_bytes(flags.cache_type_v, cells * arch.n_head_kv[il] * arch.head_dim_v)
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
        k, v = (
            arch.n_head_kv[arch.attention_layers[0]] * arch.head_dim_k,
            arch.n_head_kv[arch.attention_layers[0]] * arch.head_dim_v,
        )
        full, _ = kv_cells(arch, flags)
        pool += full * (k + v) * 2 if arch.attention_layers else 0
    matrices = [
        m
        for m in model.tensors
        if len(m.shape) == 2 and m.name.startswith("blk.") and m.type_name not in ("F32", "F16", "BF16")
    ]
    if gpu.dequantizes_for_prefill and matrices:
        pool += max(m.n_elements * 2 + m.shape[0] * t * 2 for m in matrices)  # fp16 weights and activations
    elif matrices:
        widest = max(t_.shape[0] for t_ in matrices)
        pool += widest * t * 36 // 32  # activations quantized to q8_1 for the quantized matmul
    return pad(pool, 2 * MIB)


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
