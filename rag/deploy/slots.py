"""How many users a card serves at once: llama-server slots that each keep the whole per-slot context.

Every extra slot (`-np`) costs its own KV cache (per-slot context x layers with KV x bytes per cell, the
context split with `-c` = slots x per-slot context, no `--kv-unified`: a unified cache would let one long
prompt take the cells another slot needs) and its own recurrent state (Gated DeltaNet: ~150 MiB a
sequence on the Qwen3.6-27B shape, whatever the context). The planner's memory model (`_memory`) already
counts both per slot; this module asks it how many fit, and what each user then decodes.

Decode with N users at once: one step reads every weight once for all N tokens, plus each slot's KV cache
and state, so per user it runs at bandwidth / (weights + N x (KV + 2 x state)) times the card's measured
share of its ceiling. On an H200 machine (16 GB emulation, two slots) each of two users asking at once got
0.87x of one user's rate with a logical batch (-b) of the whole context, 0.83x with -b 512, where the first
user's decode shared each step with the other's prompt batches (bench/gpu/results-h200.json, "batching");
the bandwidth model is the upper end.

Several slots get a logical batch of the whole context (-b = -c): prompts that arrive together go into one
step, so no slot starts decoding while another's prompt is still being processed beside it (it costs no
GPU memory: the compute buffer follows the micro-batch, -ub).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rag.deploy._architecture import Architecture, architecture
from rag.deploy._flags import MIB, Flags
from rag.deploy._memory import estimate
from rag.deploy._specs import ModelSpec
from rag.deploy.gpus import GPU

MAX_SLOTS = 8
MEASURED_PER_USER = 0.89  # two users at once on the H200 machine (-b 8192 -ub 512, q4_0 V), each against one user alone


@dataclass(frozen=True)
class Users:
    """How many slots of `per_slot_ctx` tokens fit, and each user's decode band with all of them busy."""

    slots: int
    per_slot_ctx: int
    flags: Flags | None  # the flags for that many slots (None: not even one fits)
    free_mib: float
    per_user_tok_s: tuple[float, float] | None
    next_needs_mib: float | None  # what one more slot would need beyond the margin (None: MAX_SLOTS reached)


def with_slots(flags: Flags, slots: int, per_slot_ctx: int) -> Flags:
    """`flags` for `slots` slots of `per_slot_ctx` tokens each (-c split evenly, no unified cache; with
    several, -b the whole context: prompts arriving together are processed in one step)."""
    batch = per_slot_ctx * slots if slots > 1 else flags.batch
    return replace(flags, parallel=slots, ctx=per_slot_ctx * slots, kv_unified=False, batch=batch)


def lighter_v(flags: Flags) -> list[Flags]:
    """`flags`, then with a q4_0 V cache where K and V are q8_0: what to try before a smaller micro-batch.

    On an H200 machine (16 GB emulation, two slots) -ub 512 with a q4_0 V cache gave a full-budget first
    token of 1.56-1.59 s against 1.74-1.75 s at -ub 256 with q8_0 V, and kept llama-server's follow-up
    checkpoint 516 tokens before the end of a prompt instead of 260; the V cache is 64 MiB smaller for
    the two slots, what the compute buffer of -ub 512 needs on a V100. K stays q8_0 (attention scores
    are the more sensitive to rounding)."""
    if flags.cache_type_k == "q8_0" and flags.cache_type_v == "q8_0":
        return [flags, replace(flags, cache_type_v="q4_0")]
    return [flags]


def _free(model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU) -> int:
    return gpu.memory_bytes - estimate(model, flags, gpu, arch).total_gpu


def per_user_decode(model: ModelSpec, arch: Architecture, flags: Flags, gpu: GPU) -> tuple[float, float] | None:
    """Each user's decode band with every slot busy (the bandwidth model; see the module's note); None
    where no measured band applies to the model's shape."""
    memory = estimate(model, flags, gpu, arch)
    step = memory.weights_gpu + memory.kv + 2 * memory.recurrent  # one step for all slots
    ceiling = gpu.bandwidth_gbs * 1e9 / step
    band = gpu.band_for(step)
    return None if band is None else (ceiling * band[0], ceiling * band[1])


def users(
    model: ModelSpec, gpu: GPU, flags: Flags, margin: int, per_slot_ctx: int | None = None, up_to: int = MAX_SLOTS
) -> Users:
    """The most slots of `per_slot_ctx` tokens (default: the flags' own per-slot context) that fit in
    `gpu` keeping `margin` bytes free, trying the flags' micro-batch, then it with a q4_0 V cache
    (`lighter_v`), then a smaller micro-batch (it shrinks the compute buffer and the CUDA pool)."""
    arch = architecture(model)
    per_slot = per_slot_ctx or flags.n_ctx // max(1, flags.parallel)
    best: Flags | None = None
    for slots in range(1, up_to + 1):
        fitting = next(
            (
                cand
                for ub in sorted({flags.n_ubatch, min(256, flags.n_ubatch)}, reverse=True)
                for cand in lighter_v(replace(with_slots(flags, slots, per_slot), ubatch=ub))
                if _free(model, arch, cand, gpu) >= margin
            ),
            None,
        )
        if fitting is None:
            break
        best = fitting
    if best is None:
        one = with_slots(flags, 1, per_slot)
        return Users(
            0, per_slot, None, _free(model, arch, one, gpu) / MIB, None, (margin - _free(model, arch, one, gpu)) / MIB
        )
    more = None
    if best.parallel < up_to:
        nxt = replace(with_slots(best, best.parallel + 1, per_slot), ubatch=min(256, best.n_ubatch))
        more = (margin - _free(model, arch, nxt, gpu)) / MIB
    band = per_user_decode(model, arch, best, gpu) if arch.first_gpu_layer(best.gpu_layers) == 0 else None
    return Users(best.parallel, per_slot, best, _free(model, arch, best, gpu) / MIB, band, more)
