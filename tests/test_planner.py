"""The planner: its memory model against llama-server's own buffer lines, and its verdicts on the production shape."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag.deploy.gpus import GPUS, get_gpu
from rag.deploy.model_shapes import (
    GIB,
    PUBLISHED_GIB,
    QWEN36_27B,
    Qwen35Hparams,
    llama_model,
    published_extra_bytes,
    qwen35_model,
    write_gguf,
)
from rag.deploy.plan_cli import plan_command
from rag.deploy.planner import (
    MIB,
    Flags,
    _with_extra,
    architecture,
    default_margin,
    estimate,
    kv_bytes_per_token,
    plan,
    read_gguf,
    tune,
)
from rag.deploy.profiles import PROFILES
from tests.servers import free_port, llama_server_binary, start_server

V100 = get_gpu("v100-16g")
# A qwen35 with the production model's proportions (n_ff ~ 3.4 n_embd, 3 recurrent : 1 attention).
TINY_QWEN35 = Qwen35Hparams(
    n_layer=8,
    n_embd=512,
    n_ff=1536,
    n_vocab=8192,
    n_head=6,
    n_head_kv=2,
    head_dim=64,
    ssm_d_state=32,
    ssm_n_group=4,
    ssm_dt_rank=12,
    context_length=8192,
)
FIELD_RECIPE = Flags(
    ctx=4096,
    parallel=1,
    cache_type_k="q8_0",
    cache_type_v="q8_0",
    batch=512,
    ubatch=1024,
    flash_attn=True,
    gpu_layers=999,
)


def production(quant: str):
    model = qwen35_model(QWEN36_27B, quant)
    return model, published_extra_bytes(model, quant)


# --- the production model described as data -------------------------------------------------------


@pytest.mark.parametrize("quant", sorted(PUBLISHED_GIB))
def test_described_quant_mixes_match_published_file_sizes(quant: str) -> None:
    model = qwen35_model(QWEN36_27B, quant)
    assert model.tensor_bytes / GIB == pytest.approx(PUBLISHED_GIB[quant], rel=0.02)


def test_production_shape_kv_and_state_per_token() -> None:
    arch = architecture(qwen35_model(QWEN36_27B, "Q4_K_S"))
    assert len(arch.attention_layers) == 16 and len(arch.recurrent_layers) == 48
    assert arch.attention_layers[:2] == (3, 7)
    assert kv_bytes_per_token(arch, "f16") == 64 * 1024
    assert kv_bytes_per_token(arch, "q8_0") == 34 * 1024
    assert kv_bytes_per_token(arch, "q4_0") == 18 * 1024
    one_slot = replace(Flags.from_profile(PROFILES["v100-16g"]), ctx=4096, parallel=1)
    memory = estimate(qwen35_model(QWEN36_27B, "Q4_K_S"), one_slot, V100)
    assert memory.kv == (68 + 36) * MIB  # 4,096 tokens of a q8_0 K (17 KiB a token) and a q4_0 V (9 KiB)
    assert memory.recurrent / MIB == pytest.approx(149.6, abs=0.1)
    # Every slot has its own: two slots of 4,096 tokens hold twice the cache and twice the state.
    two = estimate(qwen35_model(QWEN36_27B, "Q4_K_S"), Flags.from_profile(PROFILES["v100-16g"]), V100)
    assert (two.kv, two.recurrent) == (2 * memory.kv, 2 * memory.recurrent)


def test_shipped_profile_fits_the_v100_and_the_field_recipe_does_not() -> None:
    profile = PROFILES["v100-16g"]
    model, extra = production("Q4_K_S")
    shipped = plan(model, V100, Flags.from_profile(profile), extra_weight_bytes=extra)
    assert shipped.verdict == "fits"
    assert shipped.free >= shipped.margin

    model, extra = production("Q4_K_M")
    field = plan(model, V100, FIELD_RECIPE, extra_weight_bytes=extra)
    assert field.verdict == "does not fit"
    assert any("-ub 1024 is clamped to -b 512" in note for note in field.notes)
    assert any("smaller quantization" in line for line in field.advice)
    # The field report's own figure: decode is bound near 58% of 900 GB/s over ~16 GB.
    assert field.speed is not None and 29 < field.speed.low < field.speed.high < 34


def test_planner_derives_the_shipped_profile() -> None:
    candidates = {q: production(q)[0] for q in ("Q4_K_M", "Q4_K_S", "IQ4_XS")}
    extra = {q: production(q)[1] for q in candidates}
    # As many slots of 4,096 tokens as fit (up to 4): two, with -ub 512 and a q4_0 V cache (tried before a
    # halved micro-batch), and a logical batch of the whole context (both users' prompts in one step).
    quant, flags, result = tune(candidates, V100, ctx=4096, extra_weight_bytes=extra, max_slots=4)
    shipped = PROFILES["v100-16g"]
    assert (flags.parallel, flags.ctx, flags.batch, flags.n_ubatch) == (2, 8192, 8192, 512)
    assert (flags.cache_type_k, flags.cache_type_v) == ("q8_0", "q4_0")
    args = shipped.flags()
    assert args[args.index("-ctk") : args.index("-ctk") + 8] == [
        "-ctk",
        "q8_0",
        "-ctv",
        "q4_0",
        "-b",
        "8192",
        "-ub",
        "512",
    ]
    assert shipped.model == f"qwen3.6-27b-{quant.lower()}"
    derived = flags.profile(shipped.name, shipped.description, model=shipped.model)
    assert derived.flags() == shipped.flags()
    assert derived == shipped
    assert result.fits
    # No host-memory prompt cache: it delayed every new question's prefill and can cross conversations.
    assert shipped.flags()[shipped.flags().index("--cache-ram") + 1] == "0"


def test_more_memory_fits_the_recipe_and_less_suggests_flags() -> None:
    model, extra = production("Q4_K_M")
    assert plan(model, get_gpu("v100-32g"), FIELD_RECIPE, extra_weight_bytes=extra).fits
    # Q4_K_S with an f16 cache and -ub 2048 is over the margin; a smaller micro-batch brings it back.
    model, extra = production("Q4_K_S")
    heavy = Flags(ctx=8192, cache_type_k="f16", cache_type_v="f16", batch=2048, ubatch=2048)
    result = plan(model, V100, heavy, extra_weight_bytes=extra)
    assert result.verdict == "fits with flags"
    assert result.suggested is not None and result.suggested.n_ubatch < 2048
    assert result.advice == [f"fits with -b 2048 -ub {result.suggested.n_ubatch}"]
    assert plan(model, V100, result.suggested, extra_weight_bytes=extra).fits


def test_token_embd_stays_on_the_host_and_partial_offload_moves_layers() -> None:
    model, _ = production("Q4_K_S")
    embd = next(t for t in model.tensors if t.name == "token_embd.weight").n_bytes
    full = estimate(model, Flags(), V100)
    assert full.weights_host == embd
    # -ngl 33: the output head and the last 32 layers, 8 of them with a KV cache.
    half = estimate(model, Flags(gpu_layers=33), V100)
    assert half.weights_gpu < full.weights_gpu / 2 + embd
    assert half.kv == full.kv // 2 == half.kv_host
    assert half.recurrent == full.recurrent // 2


def test_every_gpu_preset_gives_a_verdict() -> None:
    model, extra = production("Q4_K_S")
    verdicts = {
        name: plan(model, gpu, Flags(cache_type_k="q8_0", cache_type_v="q8_0"), extra_weight_bytes=extra).verdict
        for name, gpu in GPUS.items()
    }
    assert verdicts["t4"] == "does not fit"
    assert verdicts["a100-40g"] == verdicts["h200"] == "fits"


# --- GGUF headers ---------------------------------------------------------------------------------


def test_read_gguf_gives_back_what_was_written(tmp_path: Path) -> None:
    spec = qwen35_model(TINY_QWEN35, "Q4_K_M", name="tiny-qwen35")
    path = write_gguf(spec, tmp_path / "tiny.gguf")
    read = read_gguf(path)
    assert read.tensors == spec.tensors
    assert read.vocab_size == TINY_QWEN35.n_vocab
    for key, value in spec.metadata.items():
        assert read.metadata[key] == pytest.approx(value)
    arch = architecture(read)
    assert arch.attention_layers == (3, 7)
    assert arch.conv_values == 3 * (TINY_QWEN35.ssm_d_inner + 2 * 4 * 32)


def test_read_gguf_skips_the_vocabulary(generator_model: Path) -> None:
    started = time.perf_counter()
    model = read_gguf(generator_model)
    elapsed = time.perf_counter() - started
    print(f"read_gguf on {generator_model.name}: {elapsed * 1000:.0f} ms")
    assert model.vocab_size == 262_144
    assert "tokenizer.ggml.tokens" not in model.metadata
    arch = architecture(model)
    assert arch.name == "gemma3" and arch.tied_output
    assert len(arch.swa_layers) == 15 and arch.n_swa == 512


def test_read_gguf_refuses_other_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf(junk)


# --- the command ----------------------------------------------------------------------------------


def test_a_gguf_without_tensors_is_one_line_of_error(tmp_path: Path) -> None:
    """A vocabulary-only GGUF (llama.cpp's models/ggml-vocab-*.gguf): no traceback, one line that says why."""
    import subprocess
    import sys

    import gguf

    path = tmp_path / "ggml-vocab-tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<s>", "</s>", "a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    done = subprocess.run(
        [sys.executable, "-m", "rag.cli", "plan", str(path), "--gpu", "t4"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith(f"Error: cannot plan {path}: ") and "holds no tensors" in done.stderr


def test_plan_command_json_on_a_described_model() -> None:
    result = CliRunner().invoke(plan_command, ["qwen3.6-27b:Q4_K_S", "--gpu", "v100-16g", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["verdict"] == "fits"
    assert body["architecture"]["recurrent_layers"] == 48
    assert body["memory_mib"]["kv"] == 136
    assert "-ctk" in body["server_args"] and "q8_0" in body["server_args"]
    assert 30 < body["decode_tok_s"]["low"] < body["decode_tok_s"]["high"] < 40


def test_plan_command_text_and_exit_status() -> None:
    runner = CliRunner()
    bad = runner.invoke(plan_command, ["qwen3.6-27b:Q4_K_M", "--gpu", "v100-16g", "--ubatch", "1024"])
    assert bad.exit_code == 1
    assert "does not fit" in bad.output and "clamped" in bad.output
    custom = runner.invoke(plan_command, ["qwen3.6-27b:IQ4_XS", "--vram", "20480", "--bandwidth", "760"])
    assert custom.exit_code == 0 and "fits" in custom.output and "llama-server" in custom.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["qwen3.6-27b:Q4_K_S"], "one of --gpu"),
        (["qwen3.6-27b:Q4_K_S", "--vram", "1000"], "--bandwidth"),
        (["nope.gguf", "--gpu", "t4"], "neither a file"),
        (["qwen3.6-27b:Q9", "--gpu", "t4"], "unknown quantization"),
    ],
)
def test_plan_command_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(plan_command, args)
    assert result.exit_code == 2
    assert message in result.output


# --- against the real llama-server (CPU build) ----------------------------------------------------

BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute) buffer size =\s+([\d.]+) MiB")


def loaded_buffers(model: Path, flags: Flags, log_dir: Path, extra: list[str]) -> dict[str, float]:
    """Start llama-server on the CPU, wait until it serves, and sum its buffer lines by kind (MiB)."""
    port = free_port()
    profile = flags.profile("probe", "memory probe")
    command = profile.command(llama_server_binary(), model, "127.0.0.1", port)
    # -lv 4 prints the buffer lines; --no-repack keeps the CPU's SIMD copies of some weights out of the count.
    command += ["-t", "1", "-lv", "4", "--no-warmup", "--no-repack", *extra]
    server = start_server("llama-server-plan", command, port, log_dir)
    try:
        log = server.log()
    finally:
        server.stop()
    sums: dict[str, float] = {}
    for _, kind, mib in BUFFER_LINE.findall(log):
        sums[kind] = sums.get(kind, 0.0) + float(mib)
    return sums


GEMMA = "gemma"
CASES = [
    (GEMMA, Flags(ctx=4096, batch=512, ubatch=512)),
    (GEMMA, Flags(ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0", batch=512, ubatch=512)),
    (GEMMA, Flags(ctx=4096, batch=512, ubatch=512, flash_attn=False)),
    (GEMMA, Flags(ctx=8192, cache_type_k="q4_0", cache_type_v="q4_0", batch=512, ubatch=256)),
    (GEMMA, Flags(ctx=4096, parallel=2, cache_type_k="q8_0", cache_type_v="q8_0", batch=512, ubatch=512)),
    (GEMMA, Flags(ctx=4096, batch=512, ubatch=512, swa_full=True)),
    ("llama", Flags(ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0", batch=512, ubatch=512)),
    ("llama", Flags(ctx=4096, batch=512, ubatch=512, flash_attn=False)),
    ("qwen35", Flags(ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0", batch=512, ubatch=512)),
    ("qwen35", Flags(ctx=2048, batch=1024, ubatch=1024)),
    ("qwen35", Flags(ctx=4096, parallel=2, cache_type_k="q8_0", cache_type_v="q8_0", batch=512, ubatch=512)),
]


@pytest.fixture(scope="module")
def small_models(tmp_path_factory: pytest.TempPathFactory, generator_model: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plan-models")
    return {
        GEMMA: generator_model,
        "llama": write_gguf(llama_model(n_layer=2, n_embd=256, n_ff=768, n_vocab=4096), root / "tiny-llama.gguf"),
        "qwen35": write_gguf(qwen35_model(TINY_QWEN35, "Q8_0", name="tiny-qwen35"), root / "tiny-qwen35.gguf"),
    }


@pytest.mark.integration
@pytest.mark.parametrize(
    "which, flags",
    CASES,
    ids=lambda c: (
        c
        if isinstance(c, str)
        else f"c{c.ctx}-np{c.parallel}-{c.cache_type_k}-fa{int(c.flash_attn)}-ub{c.n_ubatch}{'-swafull' * c.swa_full}"
    ),
)
def test_prediction_within_3_percent_of_llama_server(
    which: str, flags: Flags, small_models: dict[str, Path], tmp_path: Path
) -> None:
    path = small_models[which]
    extra = ["--no-jinja", "--chat-template", "gemma"] if which == GEMMA else []
    measured = loaded_buffers(path, flags, tmp_path, extra)
    predicted = estimate(read_gguf(path), flags)  # no GPU: everything on the host, as on this CPU
    pairs = {
        "model": (measured.get("model", 0.0), predicted.weights_gpu / MIB),
        "KV": (measured.get("KV", 0.0), predicted.kv / MIB),
        "RS": (measured.get("RS", 0.0), predicted.recurrent / MIB),
        "compute": (measured.get("compute", 0.0), predicted.compute / MIB),
    }
    print(which, flags, {k: f"{m:.2f}/{p:.2f}" for k, (m, p) in pairs.items()})
    for kind, (got, want) in pairs.items():
        assert want == pytest.approx(got, rel=0.03, abs=0.02), kind
    total_measured = sum(m for m, _ in pairs.values())
    total_predicted = sum(p for _, p in pairs.values())
    assert total_predicted == pytest.approx(total_measured, rel=0.03)


@pytest.mark.integration
@pytest.mark.slow
def test_production_shape_loads_as_predicted(tmp_path: Path) -> None:
    """The real Qwen3.6-27B shape (sparse file, no weights) loaded by llama-server on this CPU."""
    spec = qwen35_model(QWEN36_27B, "Q4_K_S")
    path = write_gguf(spec, tmp_path / "qwen3.6-27b-shape.gguf", sparse=True)
    flags = replace(Flags.from_profile(PROFILES["v100-16g"]), gpu_layers=None)
    measured = loaded_buffers(path, flags, tmp_path, [])
    predicted = estimate(read_gguf(path), flags)
    assert predicted.weights_gpu / MIB == pytest.approx(measured["model"], rel=0.005)
    assert predicted.kv / MIB == pytest.approx(measured["KV"], rel=0.005)
    assert predicted.recurrent / MIB == pytest.approx(measured["RS"], rel=0.005)
    assert predicted.compute / MIB == pytest.approx(measured["compute"], rel=0.03)


# --- against the GPU measurements (bench/gpu/results-h200.json, an H200 machine holding all but 16,160 MiB) ---

H200_RESULTS = Path(__file__).resolve().parent.parent / "bench" / "gpu" / "results-h200.json"


def emulation_entries() -> list[tuple[str, dict]]:
    if not H200_RESULTS.exists():
        return []
    return sorted(json.loads(H200_RESULTS.read_text()).get("emulation", {}).items())


@pytest.mark.parametrize("name, entry", emulation_entries(), ids=lambda v: v if isinstance(v, str) else "")
def test_prediction_matches_the_16gb_emulation(name: str, entry: dict) -> None:
    """CUDA buffers within 3% of llama-server's lines; free memory within 100 MiB; the verdict agrees."""
    window = replace(get_gpu("h200"), memory_mib=16_160)
    spec = qwen35_model(QWEN36_27B, entry["quant"])  # the file the benchmark wrote from the same description
    assert spec.tensor_bytes <= entry["file_bytes"] < spec.tensor_bytes + 16 * MIB
    flags = Flags.from_server_args(entry["flags"])
    result = plan(spec, window, flags)
    m, measured = result.memory, entry["buffers_mib"]
    assert m.weights_gpu / MIB == pytest.approx(measured["CUDA0 model"], rel=0.001)
    assert m.weights_host / MIB == pytest.approx(measured["CPU_Mapped model"], rel=0.001)
    assert m.kv / MIB == pytest.approx(measured["CUDA0 KV"], rel=0.001)
    assert m.recurrent / MIB == pytest.approx(measured["CUDA0 RS"], rel=0.001)
    if "CUDA0 compute" in measured:
        assert m.compute / MIB == pytest.approx(measured["CUDA0 compute"], rel=0.03)
    served = bool(entry.get("served_ok")) and bool(entry.get("alive_after_serving"))
    if served:
        assert result.free / MIB == pytest.approx(entry["free_after_serving_mib"], abs=100)
    assert (result.free > 0) == served
    assert result.fits == (served and entry["free_after_serving_mib"] >= result.margin / MIB)


def test_users_that_fit_the_v100_and_why_not_one_more() -> None:
    from rag.deploy.slots import users

    model, extra = production("Q4_K_S")
    one_slot = replace(Flags.from_profile(PROFILES["v100-16g"]), ctx=4096, parallel=1, cache_type_v="q8_0", ubatch=512)
    served = users(_with_extra(model, extra), V100, one_slot, default_margin(V100))
    assert (served.slots, served.per_slot_ctx) == (2, 4096)
    assert served.flags == Flags.from_profile(PROFILES["v100-16g"])
    assert served.next_needs_mib is not None and served.next_needs_mib > 0  # a third slot is over the margin
    assert served.per_user_tok_s is not None and 29 < served.per_user_tok_s[0] < served.per_user_tok_s[1] < 35
    result = CliRunner().invoke(plan_command, ["qwen3.6-27b:Q4_K_S", "--gpu", "v100-16g"])
    assert "users         2 at once, 4,096 tokens each (-c 8192 -np 2 -b 8192 -ub 512)" in result.output
    assert "one more slot would need" in result.output


def test_two_slots_in_the_16gb_emulation_match_the_prediction() -> None:
    """The slots run (bench/gpu/slots.py): per-slot KV and state as predicted, no out-of-memory over its answers."""
    entry = json.loads(H200_RESULTS.read_text())["slots"]["np2"]
    window = replace(get_gpu("h200"), memory_mib=16_160)
    flags = Flags.from_server_args(entry["flags"])
    m = plan(qwen35_model(QWEN36_27B, "Q4_K_S"), window, flags).memory
    measured = entry["buffers_mib"]
    assert m.kv / MIB == pytest.approx(measured["CUDA0 KV"], rel=0.001)
    assert m.recurrent / MIB == pytest.approx(measured["CUDA0 RS"], rel=0.001)
    assert entry["props"] == {"total_slots": 2, "n_ctx_per_slot": 4096}
    assert entry["alive_after_serving"] and not entry["out_of_memory_lines"]
    assert entry["two_users_summary"]["answers"] == 20 and entry["two_users_summary"]["errors"] == 0


def test_a_q4_0_v_cache_comes_before_a_halved_micro_batch() -> None:
    """-ub 512 with q8_0 K/V is over the V100's margin for two slots; a q4_0 V cache brings it back."""
    model, extra = production("Q4_K_S")
    q8 = replace(Flags.from_profile(PROFILES["v100-16g"]), cache_type_v="q8_0")
    result = plan(model, V100, q8, extra_weight_bytes=extra)
    assert result.verdict == "fits with flags"
    assert result.suggested == Flags.from_profile(PROFILES["v100-16g"])
    assert result.advice == ["fits with -ctk q8_0 -ctv q4_0"]


def test_the_shipped_profile_is_what_the_16gb_emulation_measured() -> None:
    """The batching run of the shipped flags (bench/gpu/batching.py): its buffers as planned, the margin kept
    after serving, two users at once at least 1.7x one user's in all and 0.85x each."""
    entry = json.loads(H200_RESULTS.read_text())["batching"]["b8192-ub512-v4"]
    assert Flags.from_server_args(entry["flags"]) == Flags.from_profile(PROFILES["v100-16g"])
    window = replace(get_gpu("h200"), memory_mib=16_160)
    result = plan(qwen35_model(QWEN36_27B, "Q4_K_S"), window, Flags.from_server_args(entry["flags"]))
    m, measured = result.memory, entry["buffers_mib"]
    assert m.kv / MIB == pytest.approx(measured["CUDA0 KV"], rel=0.001)
    assert m.compute / MIB == pytest.approx(measured["CUDA0 compute"], rel=0.03)
    assert result.fits and entry["free_after_serving_mib"] >= result.margin / MIB
    summary = entry["summary"]
    assert summary["errors"] == 0 and summary["aggregate_vs_one_user"] >= 1.7
    assert summary["two_users_per_user_tok_s_median"] >= 0.85 * summary["one_user_decode_tok_s"]


def test_the_v100s_prefill_path_in_the_16gb_emulation_holds_the_pool_the_planner_counts() -> None:
    """The same flags built two ways on one H100 machine (bench/gpu/run.sh, batching): with the quantized MMQ
    kernels a Hopper card runs, the planner's Hopper prediction holds; forced onto cuBLAS, the path a V100
    takes for prompt batches, the card keeps the fp16 pool that the planner counts for Volta, within 100 MiB,
    and still serves two users."""
    batching = json.loads(H200_RESULTS.read_text())["batching"]
    model = qwen35_model(QWEN36_27B, "Q4_K_S")
    for key, compute_capability in (("b8192-ub512-v4-h100-mmq", (9, 0)), ("b8192-ub512-v4-h100-cublas", (7, 0))):
        entry = batching[key]
        window = replace(get_gpu("h200"), memory_mib=16_160, compute_capability=compute_capability)
        result = plan(model, window, Flags.from_server_args(entry["flags"]))
        assert result.memory.compute / MIB == pytest.approx(entry["buffers_mib"]["CUDA0 compute"], rel=0.03)
        assert result.free / MIB == pytest.approx(entry["free_after_serving_mib"], abs=100), key
        assert entry["summary"]["errors"] == 0
    pool_measured = (
        batching["b8192-ub512-v4-h100-mmq"]["free_after_serving_mib"]
        - batching["b8192-ub512-v4-h100-cublas"]["free_after_serving_mib"]
    )
    assert 200 < pool_measured < 300  # the fp16 copy of the widest weight matrix and its activations


def test_a_logical_batch_of_the_whole_context_costs_no_memory_in_the_16gb_emulation() -> None:
    """The batching runs (bench/gpu/batching.py): -b 8192 left the card the buffers and free memory of -b 512,
    as the planner predicts."""
    entries = json.loads(H200_RESULTS.read_text())["batching"]
    whole, before = entries["b8192-ub256"], entries["b512-ub256"]
    assert Flags.from_server_args(whole["flags"]) == replace(
        Flags.from_profile(PROFILES["v100-16g"]), cache_type_v="q8_0", ubatch=256
    )
    assert whole["buffers_mib"] == before["buffers_mib"]
    assert whole["free_after_load_mib"] == before["free_after_load_mib"]
    window = replace(get_gpu("h200"), memory_mib=16_160)
    model = qwen35_model(QWEN36_27B, "Q4_K_S")
    planned = [plan(model, window, Flags.from_server_args(e["flags"])) for e in (whole, before)]
    assert planned[0].memory == planned[1].memory and planned[0].fits
    assert whole["alive_after_serving"] and whole["summary"]["errors"] == 0


def test_prefill_prediction_reproduces_its_anchor_and_adds_dequantization_on_volta() -> None:
    from rag.deploy.gpus import H200_PREFILL_TOK_S, predict_prefill

    model, _ = production("Q4_K_S")
    params = sum(t.n_elements for t in model.tensors if len(t.shape) == 2 and t.name != "token_embd.weight")
    weights = estimate(model, Flags.from_profile(PROFILES["v100-16g"]), V100).weights_gpu
    h200 = predict_prefill(get_gpu("h200"), 2_900, params, weights)
    assert h200.tok_s == pytest.approx((H200_PREFILL_TOK_S, H200_PREFILL_TOK_S), rel=0.01)
    v100 = predict_prefill(V100, 2_900, params, weights)
    assert v100.dequant_s[0] > 0 and h200.dequant_s == (0.0, 0.0)
    fast, slow = v100.total_s
    assert h200.total_s[0] < fast < slow
    with pytest.raises(ValueError):
        predict_prefill(get_gpu("t4"), 2_900, params, weights)


def test_a_small_model_gets_no_speed_measured_on_a_27b() -> None:
    from rag.core.config import Settings
    from rag.deploy.modellock import artifact_path, find_artifact

    smollm2 = artifact_path(find_artifact("smollm2-135m-instruct-q4_1"), Settings())
    result = CliRunner().invoke(plan_command, [str(smollm2), "--gpu", "v100-16g"])
    assert result.exit_code == 0, result.output
    decode = next(line for line in result.output.splitlines() if "decode" in line)
    assert "speed unmeasured" in decode and "expect" not in decode and "31-33 tok/s" not in decode
    users = next(line for line in result.output.splitlines() if line.strip().startswith("users"))
    assert "tok/s" not in users
    body = json.loads(CliRunner().invoke(plan_command, [str(smollm2), "--gpu", "h200", "--json"]).output)
    assert body["decode_tok_s"]["low"] is None and body["decode_tok_s"]["ceiling"] > 1000


def test_an_unknown_model_name_is_refused_with_the_known_ones() -> None:
    result = CliRunner().invoke(plan_command, ["llama3-8b:Q4_K_M", "--gpu", "h200"])
    assert result.exit_code == 2
    assert "qwen3.6-27b" in result.output and "Q4_K_M" in result.output and "path of its GGUF" in result.output
