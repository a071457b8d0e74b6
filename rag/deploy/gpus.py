"""GPU presets for the planner: memory as CUDA reports it, bandwidth, and measured decode efficiency.

`memory_mib` is the total that `nvidia-smi` shows for the card. `context_mib` is what llama-server's
process holds beyond the buffers its log lines report: the CUDA context, cuBLAS and CUDA graphs.
Measured on an H200 machine (CUDA 13): 525 MiB at context creation, 598 MiB once the model is loaded
(16,160 MiB window, bench/gpu/results-h200.json). Other cards are estimates scaled from it by their
number of multiprocessors (the context's per-thread local memory grows with them), rounded up.

`efficiency` is the measured share of the bandwidth ceiling that llama.cpp's single-stream decode
reaches on that card, as a (low, high) band. Only two cards have anchors of our own or from public
measurements; the others get the band that spans both anchors, and say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Measured: a V100 decodes a dense 27B Q4_K_M at 31-33 tok/s, about 58% of 900 GB/s / 16 GB.
V100_BAND = (0.55, 0.60)
# Measured on an H200 machine, 27B-shaped Q4_K_M (16.19 GB): llama-server 67.8-74.1 tok/s and
# llama-bench 75.9-82.0 tok/s against a 265.6 tok/s ceiling at the measured 4.30 TB/s.
H200_BAND = (0.255, 0.31)
UNMEASURED_BAND = (H200_BAND[0], V100_BAND[1])
# Both anchors decode a dense 27B Q4_K_M, reading about 16.2 GB a token. A model that reads far fewer
# bytes a token is bound by kernel launches and synchronisation, not by bandwidth: the band says nothing
# of its speed, which is then reported as unmeasured (the ceiling alone).
ANCHOR_BYTES_PER_TOKEN = 16.19e9
BAND_HOLDS_FROM = 0.5  # of the anchor's bytes a token


@dataclass(frozen=True)
class GPU:
    """One card as the planner sees it."""

    name: str
    label: str
    memory_mib: int
    bandwidth_gbs: float
    compute_capability: tuple[int, int] = (8, 0)
    context_mib: int = 500
    efficiency: tuple[float, float] = UNMEASURED_BAND
    efficiency_source: str = "no anchor on this card: band spans the V100 and H200 anchors"
    tensor_tflops: float | None = None  # dense fp16 tensor-core peak (datasheet), for the prefill model
    sm_ghz: float | None = None  # multiprocessors x boost clock (GHz): throughput of the non-matmul kernels

    def band_for(self, bytes_per_token: float) -> tuple[float, float] | None:
        """The measured efficiency band where it applies to a model reading `bytes_per_token` a token."""
        return self.efficiency if bytes_per_token >= BAND_HOLDS_FROM * ANCHOR_BYTES_PER_TOKEN else None

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def dequantizes_for_prefill(self) -> bool:
        """Volta has fp16 tensor cores but not the int8 MMA that llama.cpp's quantized matmul wants.

        For batches of 64 tokens and more llama.cpp then dequantizes each weight matrix to fp16 in its
        CUDA pool and calls cuBLAS, so the pool grows to the largest matrix in fp16.
        """
        return (7, 0) <= self.compute_capability < (7, 5)


def custom_gpu(memory_mib: int, bandwidth_gbs: float, compute_capability: tuple[int, int] = (8, 0)) -> GPU:
    """A card given by `--vram`/`--bandwidth` rather than by preset."""
    return GPU(
        name="custom",
        label=f"custom {memory_mib} MiB, {bandwidth_gbs:g} GB/s",
        memory_mib=memory_mib,
        bandwidth_gbs=bandwidth_gbs,
        compute_capability=compute_capability,
    )


GPUS: dict[str, GPU] = {
    gpu.name: gpu
    for gpu in (
        GPU(
            "v100-16g",
            "Tesla V100 16 GB",
            16_160,
            900,
            (7, 0),
            context_mib=400,
            efficiency=V100_BAND,
            efficiency_source="measured: dense 27B Q4_K_M at 31-33 tok/s",
            tensor_tflops=125,
            sm_ghz=80 * 1.53,
        ),
        GPU(
            "v100-32g",
            "Tesla V100 32 GB",
            32_510,
            900,
            (7, 0),
            context_mib=400,
            efficiency=V100_BAND,
            efficiency_source="V100 16 GB anchor (same memory system)",
        ),
        GPU("t4", "Tesla T4 16 GB", 15_360, 320, (7, 5), context_mib=300),
        GPU("a10", "A10 24 GB", 23_028, 600, (8, 6), context_mib=450),
        GPU("l4", "L4 24 GB", 23_034, 300, (8, 9), context_mib=400),
        GPU("a100-40g", "A100 40 GB", 40_960, 1_555, (8, 0), context_mib=500),
        GPU("a100-80g", "A100 80 GB SXM", 81_920, 2_039, (8, 0), context_mib=500),
        GPU("h100", "H100 80 GB SXM", 81_559, 3_350, (9, 0), context_mib=600),
        GPU(
            "h200",
            "H200 141 GB",
            143_771,
            4_300,
            (9, 0),
            context_mib=600,
            efficiency=H200_BAND,
            efficiency_source="measured on an H200 machine: 27B-shaped Q4_K_M, 67.8-82.0 tok/s",
            tensor_tflops=990,
            sm_ghz=132 * 1.98,
        ),
        GPU("rtx3090", "GeForce RTX 3090 24 GB", 24_576, 936, (8, 6), context_mib=450),
        GPU("rtx4090", "GeForce RTX 4090 24 GB", 24_564, 1_008, (8, 9), context_mib=550),
    )
}


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU preset {name!r}; known: {', '.join(GPUS)}") from None


# --- prefill (prompt processing), for a TTFT prediction on cards we cannot run ----------------------
#
# Measured on an H200 machine (bench/gpu/results-h200.json, "stack"): the Qwen3.6-27B-shaped Q4_K_S
# prefills ~2,000-2,100 tokens/s at -ub 512 whatever the flags. There llama.cpp multiplies the quantized
# weights directly (int8 MMQ). We split that time into the weight matmuls and the rest (48 DeltaNet
# layers' recurrence, 16 attention layers, norms, graph launches) with an assumed MMQ rate of 130-200
# TFLOP/s on Hopper; the rest is what is left of the measured time.
#
# On Volta (no int8 MMA) each weight matrix is dequantized to fp16 for every micro-batch (read the
# quantized bytes, write fp16) and multiplied by cuBLAS on the tensor cores, which is compute-bound at
# 512 tokens (512 FLOP/byte > the V100's ~140). So a card that dequantizes for prefill costs, per prompt:
#   matmul  = 2 x params x tokens / (tensor peak x 0.50-0.75)
#   dequant = micro-batches x (quantized bytes + 2 x params) / (bandwidth x 0.60-0.80)
#   rest    = the H200's rest, scaled between the multiprocessor-throughput ratio (compute-bound kernels)
#             and the bandwidth ratio (memory-bound ones)
# Every factor is a band; the prediction is the band's two ends, not a point.
H200_PREFILL_TOK_S = 2_050.0
MMQ_TFLOPS_H200 = (200.0, 130.0)  # assumed, (fast, slow)
CUBLAS_EFFICIENCY = (0.75, 0.50)
DEQUANT_BANDWIDTH_EFFICIENCY = (0.80, 0.60)


@dataclass(frozen=True)
class PrefillPrediction:
    """Seconds to prefill `tokens` new tokens, each part as (fast, slow)."""

    tokens: int
    matmul_s: tuple[float, float]
    dequant_s: tuple[float, float]
    rest_s: tuple[float, float]

    @property
    def total_s(self) -> tuple[float, float]:
        (m0, m1), (d0, d1), (r0, r1) = self.matmul_s, self.dequant_s, self.rest_s
        return round(m0 + d0 + r0, 3), round(m1 + d1 + r1, 3)

    @property
    def tok_s(self) -> tuple[float, float]:
        fast, slow = self.total_s
        return (round(self.tokens / fast), round(self.tokens / slow))


def predict_prefill(
    gpu: GPU,
    tokens: int,
    matmul_params: int,
    weight_bytes: int,
    ubatch: int = 512,
    anchor: GPU | None = None,
    anchor_tok_s: float = H200_PREFILL_TOK_S,
) -> PrefillPrediction:
    """Prefill time of `tokens` new tokens on `gpu`, from the H200 anchor and the card's datasheet.

    The two ends are the fastest and the slowest combination of the bands above (the anchor's split,
    how the rest scales, the card's matmul and dequantization efficiencies).
    """
    anchor = anchor or GPUS["h200"]
    if not (gpu.tensor_tflops and gpu.sm_ghz and anchor.tensor_tflops and anchor.sm_ghz):
        raise ValueError(f"{gpu.label}: no tensor-core rate or multiprocessor count to predict prefill from")
    flops = 2.0 * matmul_params * tokens
    anchor_s = tokens / anchor_tok_s
    passes = math.ceil(tokens / ubatch) * (weight_bytes + 2 * matmul_params)
    ends = []
    for mmq in MMQ_TFLOPS_H200:
        anchor_matmul = flops / (mmq * 1e12)
        anchor_rest = max(anchor_s - anchor_matmul, 0.0)
        for ratio in (anchor.sm_ghz / gpu.sm_ghz, anchor.bandwidth_gbs / gpu.bandwidth_gbs):
            for eff, bw_eff in zip(CUBLAS_EFFICIENCY, DEQUANT_BANDWIDTH_EFFICIENCY):
                if gpu.dequantizes_for_prefill:
                    matmul = flops / (gpu.tensor_tflops * 1e12 * eff)
                    dequant = passes / (gpu.bandwidth_gbs * 1e9 * bw_eff)
                else:
                    matmul, dequant = anchor_matmul * anchor.tensor_tflops / gpu.tensor_tflops, 0.0
                ends.append((matmul + dequant + anchor_rest * ratio, matmul, dequant, anchor_rest * ratio))
    fast, slow = min(ends), max(ends)

    def pair(k: int) -> tuple[float, float]:
        return round(fast[k], 3), round(slow[k], 3)

    return PrefillPrediction(tokens, pair(1), pair(2), pair(3))
