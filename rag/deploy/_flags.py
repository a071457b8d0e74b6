"""What llama-server is asked to do: the flags that size its memory."""

from __future__ import annotations

from dataclasses import dataclass

from rag.deploy.profiles import ServerProfile

MIB = 1024 * 1024
GIB = 1024 * MIB
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")


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
        return pad(self.ctx, 256)

    @classmethod
    def from_profile(cls, profile: ServerProfile) -> Flags:
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
    def from_server_args(cls, args: list[str]) -> Flags:
        """The memory-sizing flags of a llama-server argument list (short spellings, as ServerProfile writes them)."""
        values = {a: b for a, b in zip(args, args[1:]) if a.startswith("-")}
        get = values.get
        return cls(
            ctx=int(get("-c", 4096)),
            parallel=int(get("-np", 1)),
            cache_type_k=get("-ctk", "f16"),
            cache_type_v=get("-ctv", "f16"),
            batch=int(get("-b", 2048)),
            ubatch=int(get("-ub", 512)),
            flash_attn=get("-fa", "auto") != "off",
            gpu_layers=int(get("-ngl", -1)) if "-ngl" in values else None,
            swa_full="--swa-full" in args,
            cache_ram_mib=int(values["--cache-ram"]) if "--cache-ram" in values else None,
        )

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


def pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to
