"""`rag plan`: will this GGUF fit this GPU under llama-server, with which flags, how fast?"""

from __future__ import annotations

import json
from pathlib import Path

import click

from rag.deploy.gpus import GPUS, custom_gpu, get_gpu
from rag.deploy.model_shapes import FTYPE_BASE, PUBLISHED_GIB, ModelSpec, published_extra_bytes, qwen35_model
from rag.deploy.planner import CACHE_TYPES, MIB, Flags, GGUFFormatError, Plan, plan, read_gguf
from rag.deploy.slots import MAX_SLOTS, MEASURED_PER_USER, Users, users

# Models the planner knows by shape alone (no file needed): NAME:QUANT.
DESCRIBED = {"qwen3.6-27b": qwen35_model}


def load_model(spec: str) -> tuple[ModelSpec, int]:
    """A GGUF path, or a described model as NAME:QUANT (e.g. qwen3.6-27b:Q4_K_S); with the unitemized bytes."""
    name, _, quant = spec.partition(":")
    if name.lower() in DESCRIBED and not Path(spec).exists():
        quant = quant.upper() or "Q4_K_M"
        if quant not in FTYPE_BASE:
            raise click.BadParameter(
                f"unknown quantization {quant!r}; known: {', '.join(FTYPE_BASE)}", param_hint="MODEL"
            )
        model = DESCRIBED[name.lower()](ftype=quant)
        extra = published_extra_bytes(model, quant) if quant in PUBLISHED_GIB else 0
        return model, extra
    path = Path(spec)
    if not path.is_file():
        raise click.BadParameter(
            f"{spec} is neither a file nor a described model; the described models are "
            f"{', '.join(DESCRIBED)} (as NAME:QUANT, QUANT one of {', '.join(FTYPE_BASE)}); "
            "for any other model give the path of its GGUF",
            param_hint="MODEL",
        )
    try:
        return read_gguf(path), 0
    except (GGUFFormatError, ValueError, OSError) as exc:  # the file is there, but holds nothing to plan
        raise click.ClickException(f"cannot plan {spec}: {exc}") from None


@click.command("plan")
@click.argument("model", metavar="MODEL")
@click.option("--gpu", "gpu_name", type=click.Choice(sorted(GPUS)), default=None, help="A card preset.")
@click.option("--vram", type=int, default=None, help="Any other card: its memory in MiB (as nvidia-smi shows it).")
@click.option("--bandwidth", type=float, default=None, help="With --vram: its memory bandwidth in GB/s.")
@click.option("--ctx", type=click.IntRange(256), default=4096, show_default=True, help="Context size (-c).")
@click.option("--parallel", type=click.IntRange(1), default=1, show_default=True, help="Slots (-np).")
@click.option(
    "--cache-type", type=click.Choice(CACHE_TYPES), default="q8_0", show_default=True, help="K and V cache type."
)
@click.option("--batch", type=click.IntRange(1), default=512, show_default=True, help="Logical batch (-b).")
@click.option(
    "--ubatch",
    type=click.IntRange(1),
    default=512,
    show_default=True,
    help="Micro-batch (-ub); above -b it is clamped.",
)
@click.option("--flash-attn/--no-flash-attn", default=True, show_default=True)
@click.option("--ngl", type=click.IntRange(0), default=None, help="Layers on the GPU (default: all, output head too).")
@click.option(
    "--margin", type=click.IntRange(0), default=None, help="MiB to keep free (default: 512 or 3% of the card)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(
    model: str,
    gpu_name: str | None,
    vram: int | None,
    bandwidth: float | None,
    ctx: int,
    parallel: int,
    cache_type: str,
    batch: int,
    ubatch: int,
    flash_attn: bool,
    ngl: int | None,
    margin: int | None,
    as_json: bool,
) -> None:
    """Predict llama-server's memory for MODEL on a GPU, give a verdict and the flags to run it.

    MODEL is a GGUF file (only its header is read) or a described model as NAME:QUANT.
    Exit status 1 when the model does not fit.

    \b
    Examples:
      rag plan qwen3.6-27b-Q4_K_S.gguf --gpu v100-16g
      rag plan qwen3.6-27b:Q4_K_M --gpu v100-16g --ctx 4096 --cache-type q8_0 --json
      rag plan model.gguf --vram 20480 --bandwidth 760
    """
    if (vram is None) == (gpu_name is None):
        raise click.UsageError("give one of --gpu PRESET or --vram MIB (with --bandwidth)")
    if vram is not None and bandwidth is None:
        raise click.UsageError("--vram needs --bandwidth (GB/s) for the speed estimate")
    gpu = get_gpu(gpu_name) if gpu_name else custom_gpu(vram or 0, bandwidth or 0.0)
    spec, extra = load_model(model)
    flags = Flags(
        ctx=ctx,
        parallel=parallel,
        cache_type_k=cache_type,
        cache_type_v=cache_type,
        batch=batch,
        ubatch=ubatch,
        flash_attn=flash_attn,
        gpu_layers=ngl,
    )
    result = plan(spec, gpu, flags, margin=None if margin is None else margin * MIB, extra_weight_bytes=extra)
    served = users(result.memory_model or spec, gpu, result.suggested or flags, result.margin)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "users": users_dict(served)}, indent=2))
    else:
        click.echo(render(result) + "\n" + render_users(served))
    if result.verdict == "does not fit":
        click.get_current_context().exit(1)


def users_dict(u: Users) -> dict[str, object]:
    return {
        "at_once": u.slots,
        "per_slot_ctx": u.per_slot_ctx,
        "server_args": [] if u.flags is None else u.flags.profile("plan", "planned").flags(),
        "free_mib": round(u.free_mib, 1),
        "per_user_decode_tok_s": None if u.per_user_tok_s is None else [round(v, 1) for v in u.per_user_tok_s],
        "one_more_slot_needs_mib": None if u.next_needs_mib is None else round(u.next_needs_mib, 1),
    }


def render_users(u: Users) -> str:
    """How many users fit at once, each with the whole per-slot context, and why not one more."""
    if u.flags is None:
        return f"  users         none: one slot of {u.per_slot_ctx:,} tokens needs {u.next_needs_mib:,.0f} MiB more"
    f = u.flags
    line = f"  users         {u.slots} at once, {u.per_slot_ctx:,} tokens each (-c {f.ctx} -np {f.parallel} -b {f.batch} -ub {f.n_ubatch})"
    if u.per_user_tok_s:
        low, high = u.per_user_tok_s
        line += (
            f"; each decodes {low:.1f}-{high:.1f} tok/s with all busy (bandwidth model; "
            f"{MEASURED_PER_USER:.2f}x of one user measured for two on an H200 machine)"
        )
    if u.slots == MAX_SLOTS:
        line += f"\n                (the planner counts at most {MAX_SLOTS} slots)"
    elif u.next_needs_mib is not None:
        line += f"\n                one more slot would need {u.next_needs_mib:,.0f} MiB beyond the margin"
    return line


def render(p: Plan) -> str:
    """The plan as a short report."""
    m, a, f = p.memory, p.arch, p.flags
    types = ", ".join(f"{t} {b / MIB:,.0f}" for t, b in sorted(p.weights_by_type.items(), key=lambda kv: -kv[1]))
    lines = [f"{p.model} on {p.gpu.label} ({p.gpu.memory_mib:,} MiB, {p.gpu.bandwidth_gbs:,.0f} GB/s)"]
    if a:
        parts = [f"{a.n_layer} layers", f"{len(a.attention_layers)} with KV cache"]
        if a.recurrent_layers:
            parts.append(f"{len(a.recurrent_layers)} recurrent")
        if a.swa_layers:
            parts.append(f"{len(a.swa_layers)} sliding-window ({a.n_swa})")
        heads = f"{max(a.n_head or (0,))} heads / {max(a.n_head_kv or (0,))} KV heads, head dim {a.head_dim_k}"
        lines.append(f"  architecture  {a.name}: {', '.join(parts)}; {heads}")
    lines += [
        f"  weights       {m.weights_gpu / MIB:>9,.0f} MiB on the GPU ({types}); {m.weights_host / MIB:,.0f} MiB in system memory",
        f"  KV cache      {m.kv / MIB:>9,.0f} MiB ({f.cache_type_k}/{f.cache_type_v}, -c {f.ctx}, {f.parallel} slot(s))",
        f"  recurrent     {m.recurrent / MIB:>9,.0f} MiB",
        f"  compute       {m.compute / MIB:>9,.0f} MiB (micro-batch {f.n_ubatch}, flash attention {'on' if f.flash_attn else 'off'})",
        f"  CUDA pool     {m.pool / MIB:>9,.0f} MiB",
        f"  CUDA context  {m.context / MIB:>9,.0f} MiB (not in llama-server's lines; per card, rag/deploy/gpus.py)",
        f"  total         {m.total_gpu / MIB:>9,.0f} MiB of {p.gpu.memory_mib:,}: {p.free / MIB:,.0f} MiB free "
        f"(llama-server's own lines: {m.reported_gpu / MIB:,.0f}; keep {p.margin / MIB:,.0f} free)",
        f"  verdict       {p.verdict}",
    ]
    lines += [f"                {line}" for line in p.advice]
    lines += [f"  note          {note}" for note in p.notes]
    if p.speed:
        s = p.speed
        expect = "speed unmeasured" if s.low is None or s.high is None else f"expect {s.low:.1f}-{s.high:.1f} tok/s"
        lines.append(
            f"  decode        ceiling {s.ceiling:.1f} tok/s ({s.bytes_per_token / 1e9:.2f} GB a token); "
            f"{expect} ({s.source})"
        )
    if p.verdict != "does not fit":
        lines.append("  llama-server  " + " ".join(p.server_args("MODEL.gguf", "0.0.0.0", 8080)[1:]))
    return "\n".join(lines)
