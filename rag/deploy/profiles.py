"""llama-server launch profiles: the one place its flags come from (`rag up`, compose.yaml, the GPU benchmark)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ServerProfile:
    """Flags for one deployment of llama-server."""

    name: str
    description: str
    ctx: int = 4096  # -c: the whole cache; each of the `parallel` slots gets ctx / parallel
    parallel: int = 1
    gpu_layers: int | None = None
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    batch: int = 512
    ubatch: int = 512
    threads: int | None = None
    cache_ram_mib: int | None = None  # --cache-ram; None: llama-server's default (8,192 MiB of host RAM)
    chat_template: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    model: str | None = None  # the models.lock artifact (GGUF) this profile was planned for

    def __post_init__(self) -> None:
        # llama.cpp silently uses min(batch, ubatch): refuse a profile that would be clamped.
        if self.ubatch > self.batch:
            raise ValueError(f"profile {self.name}: ubatch {self.ubatch} > batch {self.batch} would be clamped")

    @property
    def slot_ctx(self) -> int:
        """Each slot's context: what one prompt and its answer may use."""
        return self.ctx // max(1, self.parallel)

    def flags(self) -> list[str]:
        """The model-independent flags, in a stable order."""
        args = ["-c", str(self.ctx), "-np", str(self.parallel)]
        if self.gpu_layers is not None:
            args += ["-ngl", str(self.gpu_layers)]
        args += ["-fa", self.flash_attn, "-ctk", self.cache_type_k, "-ctv", self.cache_type_v]
        args += ["-b", str(self.batch), "-ub", str(self.ubatch)]
        if self.threads is not None:
            args += ["-t", str(self.threads)]
        # -fit would silently shrink the context or move layers to the CPU: we plan the fit instead.
        args += ["-fit", "off", "--metrics"]
        if self.cache_ram_mib is not None:
            args += ["--cache-ram", str(self.cache_ram_mib)]
        if self.chat_template:
            # Without --no-jinja, a template name is read as a literal Jinja template.
            args += ["--no-jinja", "--chat-template", self.chat_template]
        else:
            args += ["--jinja"]
        return args + list(self.extra)

    def command(self, binary: str | Path, model: str | Path, host: str, port: int) -> list[str]:
        return [str(binary), "-m", str(model), "--host", host, "--port", str(port), *self.flags()]


PROFILES: dict[str, ServerProfile] = {
    "cpu": ServerProfile(
        name="cpu",
        description="Embedded default: the bundled Gemma 3 270M on 2 CPU cores beside the embedder.",
        threads=1,  # two threads against the embedder on 2 cores measured slower than one
        chat_template="gemma",
        # Gemma 3 attends through a sliding window: without a full-size SWA cache llama-server cannot
        # roll its cache back to a shared prefix, and every prompt whose sources changed was processed
        # from token 0 (cache_n 0) instead of reusing the fixed system prompt. ~70 MB more at 4,096.
        extra=("--swa-full",),
    ),
    "cpu-instruct": ServerProfile(
        name="cpu-instruct",
        description="Embedded instruct generator: the bundled SmolLM2 135M Instruct on 2 CPU cores beside the embedder.",
        threads=1,
        # The chat template (ChatML) is in the GGUF: --jinja reads it. No sliding window, so no --swa-full.
        model="smollm2-135m-instruct-q4_1",
    ),
    # Derived by the planner (rag.deploy.planner.tune on the production model's shape, V100 16 GB, 4,096
    # tokens a slot, as many slots as fit); tests/test_planner.py checks that the planner still derives
    # exactly this. Two slots of 4,096 tokens each (-c 8192 split in two): two users decode at once; the
    # second slot's KV cache and recurrent state (~250 MiB) fit beside the model with -ub 512 once V is
    # q4_0 (64 MiB less for the two slots than q8_0; `rag plan` keeps 526 MiB free against the 512 MiB
    # margin). On an H200 machine (16 GB emulation) -ub 512 with q4_0 V against -ub 256 with q8_0 V: a
    # full-budget first token of 1.56-1.59 s against 1.74-1.75 s, two users 65-66 tok/s each (1.78-1.81x
    # one user's, aggregate) against 65 (1.70-1.77x), and llama-server's follow-up checkpoint 516 tokens
    # before the end of a prompt instead of 260. -b 8192 (the whole context): two prompts that arrive
    # together are processed in one step, so neither user's decode shares its steps with the other's
    # prefill (1.74x against 1.68x at -b 512), while the first user's first token waits for both prompts.
    "v100-16g": ServerProfile(
        name="v100-16g",
        description="Qwen3.6-27B Q4_K_S on one Tesla V100 16 GB: every layer on the GPU, q8_0 K and q4_0 V, flash attention, "
        "two slots of 4,096 tokens.",
        ctx=8192,
        parallel=2,
        gpu_layers=999,
        flash_attn="on",
        cache_type_k="q8_0",
        cache_type_v="q4_0",
        batch=8192,
        ubatch=512,
        # No host-memory prompt cache: saving the previous prompt to host RAM cost 390-650 ms before every
        # new question's prefill on an H200 machine, and a restored cache can leak another conversation's
        # prompt (llama.cpp issue #27148). Each slot's own cache still reuses its conversation's prefix.
        cache_ram_mib=0,
        model="qwen3.6-27b-q4_k_s",
    ),
}


def get_profile(name: str) -> ServerProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown llama-server profile {name!r}; known: {', '.join(PROFILES)}") from None
