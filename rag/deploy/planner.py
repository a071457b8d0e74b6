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

The parts have modules of their own: the GGUF reader (`_gguf_reader`), the architecture
(`_architecture`), the flags (`_flags`) and the memory model (`_memory`); this one holds the plan and
the tuned profile, and re-exports the public names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rag.deploy._architecture import Architecture, architecture
from rag.deploy._flags import CACHE_TYPES, GIB, MIB, Flags
from rag.deploy._gguf_reader import GGUFFormatError, read_gguf
from rag.deploy._memory import (
    UNITEMIZED,
    Memory,
    compute_bytes,
    estimate,
    kv_bytes,
    kv_cells,
    pool_bytes,
    recurrent_bytes,
    type_bytes,
    weight_bytes,
)
from rag.deploy._specs import ModelSpec, TensorSpec
from rag.deploy.gpus import ANCHOR_BYTES_PER_TOKEN, GPU
from rag.deploy.slots import lighter_v, users

__all__ = [
    "CACHE_TYPES",
    "GIB",
    "MIB",
    "UNITEMIZED",
    "Architecture",
    "Flags",
    "GGUFFormatError",
    "Memory",
    "Plan",
    "Speed",
    "architecture",
    "compute_bytes",
    "decode_speed",
    "default_margin",
    "estimate",
    "kv_bytes",
    "kv_bytes_per_token",
    "kv_cells",
    "plan",
    "pool_bytes",
    "read_gguf",
    "recurrent_bytes",
    "tune",
    "weight_bytes",
]


# --- the plan -------------------------------------------------------------------------------------


def default_margin(gpu: GPU) -> int:
    """Free memory to keep: 512 MiB or 3% of the card, whichever is more."""
    return max(512 * MIB, gpu.memory_bytes * 3 // 100)


@dataclass(frozen=True)
class Speed:
    bytes_per_token: int
    ceiling: float
    low: float | None  # None: no measurement applies to this shape
    high: float | None
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
    memory_model: ModelSpec | None = None  # the model as planned (with the weights its table does not show)

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
            "gpu": {
                "name": self.gpu.name,
                "label": self.gpu.label,
                "memory_mib": self.gpu.memory_mib,
                "bandwidth_gbs": self.gpu.bandwidth_gbs,
            },
            "flags": {**self.flags.__dict__, "n_ubatch": self.flags.n_ubatch, "n_ctx": self.flags.n_ctx},
            "memory_mib": {
                "weights_gpu": m.weights_gpu / MIB,
                "weights_host": m.weights_host / MIB,
                "kv": m.kv / MIB,
                "recurrent": m.recurrent / MIB,
                "compute": m.compute / MIB,
                "cuda_pool": m.pool / MIB,
                "cuda_context": m.context / MIB,
                "reported_by_llama_server": m.reported_gpu / MIB,
                "total_gpu": m.total_gpu / MIB,
                "card": self.gpu.memory_mib,
                "free": self.free / MIB,
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
            out["decode_tok_s"] = {
                "ceiling": s.ceiling,
                "low": s.low,
                "high": s.high,
                "bytes_per_token": s.bytes_per_token,
                "source": s.source,
            }
        if self.arch:
            a = self.arch
            out["architecture"] = {
                "name": a.name,
                "layers": a.n_layer,
                "n_embd": a.n_embd,
                "n_ff": a.n_ff,
                "n_vocab": a.n_vocab,
                "heads": max(a.n_head or (0,)),
                "kv_heads": max(a.n_head_kv or (0,)),
                "head_dim_k": a.head_dim_k,
                "head_dim_v": a.head_dim_v,
                "attention_layers": len(a.attention_layers),
                "recurrent_layers": len(a.recurrent_layers),
                "sliding_window_layers": len(a.swa_layers),
                "kv_bytes_per_token": {ct: kv_bytes_per_token(a, ct) for ct in ("f16", "q8_0", "q4_0")},
            }
        return out


def kv_bytes_per_token(arch: Architecture, cache_type: str) -> int:
    k, v = arch.kv_values_per_token()
    return type_bytes(cache_type, k) + type_bytes(cache_type, v)


def decode_speed(memory: Memory, arch: Architecture, flags: Flags, gpu: GPU) -> Speed:
    """Decode ceiling at a full context: every GPU weight, the whole KV cache and the state, once a token."""
    per_token = memory.weights_gpu + memory.kv + 2 * memory.recurrent // max(1, flags.parallel)
    ceiling = gpu.bandwidth_gbs * 1e9 / per_token
    band = gpu.band_for(per_token)
    if band is None:
        source = (
            f"no measurement of this shape: the measured bands are of a dense 27B reading "
            f"{ANCHOR_BYTES_PER_TOKEN / 1e9:.1f} GB a token; a model this small is bound by kernel launches, not bandwidth"
        )
        return Speed(per_token, ceiling, None, None, source)
    return Speed(per_token, ceiling, ceiling * band[0], ceiling * band[1], gpu.efficiency_source)


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
    result = Plan(
        model.name,
        gpu,
        flags,
        memory,
        margin,
        "fits" if ok else "does not fit",
        notes=notes,
        weights_by_type=by_type,
        arch=arch,
        memory_model=model,
    )
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
        notes.append(
            f"-c {flags.ctx} is split across {flags.parallel} slots: {flags.n_ctx // flags.parallel} tokens each"
        )
    if flags.parallel > 1 and flags.batch < flags.n_ctx:
        notes.append(
            f"-b {flags.batch} is less than the whole context ({flags.n_ctx}): prompts that arrive together take "
            "several steps, and a slot that already decodes shares each with another's prompt (-b "
            f"{flags.n_ctx} costs no memory; two users on an H200 machine decoded 1.74x one user's against 1.68x)"
        )
    return notes


def _fitting_flags(model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU, margin: int) -> Flags | None:
    """The smallest change of memory-only flags (same context, same layers) that fits."""
    fa = replace(flags, flash_attn=True, ubatch=flags.n_ubatch)
    caches = [(flags.cache_type_k, flags.cache_type_v)] + [(c, c) for c in ("q8_0", "q4_0")]
    for k, v in caches:
        for ub in sorted({flags.n_ubatch, min(256, flags.n_ubatch), min(128, flags.n_ubatch)}, reverse=True):
            # a q8_0 cache tries a q4_0 V before the micro-batch halves (rag.deploy.slots.lighter_v)
            for cand in lighter_v(replace(fa, cache_type_k=k, cache_type_v=v, ubatch=ub)):
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


def _what_to_change(
    model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU, margin: int, memory: Memory
) -> list[str]:
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


def tune(
    candidates: dict[str, ModelSpec],
    gpu: GPU,
    ctx: int,
    parallel: int = 1,
    extra_weight_bytes: dict[str, int] | None = None,
    max_slots: int | None = None,
) -> tuple[str, Flags, Plan]:
    """The best-quality candidate (in the given order) that fits with every layer on the GPU.

    With `max_slots`, `ctx` is each slot's context and the profile takes as many slots as fit, up to
    `max_slots` (rag.deploy.slots: -c = slots x ctx, a q4_0 V cache and then -ub 256 when that is what
    lets them fit).

    Flags: flash attention on (needed for a quantized V cache); a q8_0 K/V cache (its perplexity cost
    is within noise, it halves the cache and the KV bytes read per token, and the memory it saves
    goes to the margin), then a q4_0 V cache before a smaller micro-batch (rag.deploy.slots.lighter_v:
    -ub 512 prefills a full-budget prompt ~0.17 s sooner than -ub 256 on an H200 machine), q4_0 K/V only
    if those do not fit; -b = -ub = 512 (a larger micro-batch grows the compute buffer for little prefill
    gain with one slot), and with several slots -b the whole context
    (rag.deploy.slots: prompts arriving together go into one step); the context and slots as asked; no
    host-memory prompt cache (--cache-ram 0: saving the old prompt to host RAM delayed every new question's
    prefill by 390-650 ms on an H200 machine, and restoring it can cross conversations, llama.cpp #27148;
    the slot's own cache keeps reusing a repeated prefix).
    """
    extra = extra_weight_bytes or {}
    for name, model in candidates.items():
        for cache in ("q8_0", "q4_0"):
            flags = Flags(
                ctx=ctx,
                parallel=parallel,
                cache_type_k=cache,
                cache_type_v=cache,
                batch=512,
                ubatch=512,
                flash_attn=True,
                gpu_layers=None,
                cache_ram_mib=0,
            )
            if max_slots is not None:
                served = users(_with_extra(model, extra.get(name, 0)), gpu, flags, default_margin(gpu), ctx, max_slots)
                if served.flags is None:
                    continue
                flags = served.flags
            result = plan(model, gpu, flags, extra_weight_bytes=extra.get(name, 0))
            if result.fits:
                return name, flags, result
    raise ValueError(f"no candidate fits {gpu.label} with a {ctx}-token context")
