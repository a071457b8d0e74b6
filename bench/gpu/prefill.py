"""Prompt processing of one llama.cpp build: llama-bench, then the shipped profile's full-budget first token.

    python3 bench/gpu/prefill.py --bin DIR --model GGUF --out DIR --label NAME [--deadline EPOCH]
        [--bench-ub 512,2048] [--server-ub 512]

For comparing builds of the pinned source (run.sh's LLAMA_CMAKE_ARGS, e.g. -DGGML_CUDA_FORCE_CUBLAS=ON):
- llama-bench on the whole card: a 3,584-token prompt (-p 3584 -n 0, five repetitions) at each -ub, flash
  attention, q8_0 K and q4_0 V as the `v100-16g` profile has them, and decode (-p 0 -n 64) at the first -ub;
- llama-server with the `v100-16g` flags (only -ub changed, where --server-ub names another) on the 16 GB
  emulation (all but 16,160 MiB held, bench/gpu/hold.py): three full-budget prompts of 3,584 random tokens,
  nothing cached, 16 tokens generated; the time to the first streamed token and the server's prompt rate.
Each timing carries the machine's load average. Results under "prefill" in OUT/results-h200.json, keyed
LABEL-bench, LABEL-server-ubN.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from batching import SHIPPED, timed, with_batch  # noqa: E402
from driver import (  # noqa: E402
    PROMPT_TOKENS,
    V100_MIB,
    Run,
    Server,
    holder,
    holder_free,
    holder_stop,
    llama_bench,
    model_step_parser,
    model_step_run,
    vocab_size,
)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def bench(run: Run, model: Path, label: str, ubatches: list[int]) -> None:
    key = f"{label}-bench"
    if run.done("prefill", key) or run.left() < 60:
        return
    flags = SHIPPED.flags()
    cache = ["-fa", "1", "-ctk", flag(flags, "-ctk"), "-ctv", flag(flags, "-ctv")]
    prompt = ["-p", "64", "-n", "0"] if run.dry else ["-p", str(PROMPT_TOKENS), "-n", "0"]
    entry: dict[str, Any] = {"load_before": load()}
    entry["pp"] = llama_bench(
        run,
        f"prefill-{label}-pp",
        model,
        [*prompt, "-r", "1" if run.dry else "5", "-b", "4096", "-ub", ",".join(map(str, ubatches)), *cache],
        timeout=min(240, run.left() - 20),
    )
    entry["load_after_pp"] = load()
    decode = ["-p", "0", "-n", "8" if run.dry else "64"]
    entry["tg"] = llama_bench(
        run,
        f"prefill-{label}-tg",
        model,
        [*decode, "-r", "1" if run.dry else "3", "-ub", str(ubatches[0]), *cache],
        timeout=min(120, run.left() - 20),
    )
    entry["load_after_tg"] = load()
    run.save("prefill", key, entry)


def server(run: Run, model: Path, label: str, ubatch: int, n_vocab: int) -> None:
    key = f"{label}-server-ub{ubatch}"
    if run.done("prefill", key) or run.left() < 75:
        return
    flags = SHIPPED.flags()
    flags = with_batch(flags, int(flag(flags, "-b")), ubatch, flag(flags, "-ctk"), flag(flags, "-ctv"))
    rng = random.Random(ubatch)
    prompt_n = 200 if run.dry else PROMPT_TOKENS

    def tokens(n: int) -> list[int]:
        return [rng.randrange(300, n_vocab) for _ in range(n)]

    held = None if run.dry else holder(V100_MIB)
    srv = Server(run, model, flags, f"prefill-{key}")
    entry: dict[str, Any] = {"flags": flags, "load_before": load()}
    try:
        if not srv.wait_ready(min(180, run.left() - 30)):
            entry["error"] = srv.failure()
            return
        entry["free_after_load_mib"] = holder_free(held)
        entry["buffers_mib"] = srv.buffers()
        timed(srv.url, tokens(64), 4, None)  # warm-up
        fresh = []
        for _ in range(3):
            row = timed(srv.url, tokens(prompt_n), 16, None)
            row["load"] = load()
            fresh.append(row)
        entry["full_budget_fresh"] = fresh
        entry["full_budget_ttft_s_median"] = round(statistics.median(r["ttft_s"] for r in fresh), 3)
        entry["prompt_tok_s_median"] = round(statistics.median(r["prompt_tok_s"] for r in fresh), 1)
        entry["free_after_serving_mib"] = holder_free(held)
        entry["alive_after_serving"] = srv.proc.poll() is None
    except Exception as exc:  # noqa: BLE001 - a benchmark keeps what it measured and reports the rest
        entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
    finally:
        srv.stop()
        holder_stop(held)
        run.save("prefill", key, entry)


def main() -> None:
    parser = model_step_parser(__doc__)
    parser.add_argument("--label", required=True)
    parser.add_argument("--bench-ub", default="512,2048")
    parser.add_argument("--server-ub", default="512")
    args = parser.parse_args()
    run = model_step_run(args)
    if (run.bin / "llama-bench").exists():
        bench(run, args.model, args.label, [int(u) for u in args.bench_ub.split(",")])
    n_vocab = vocab_size(args.model)
    for ubatch in (int(u) for u in args.server_ub.split(",") if u):
        server(run, args.model, args.label, ubatch, n_vocab)
    for key, entry in run.results.get("prefill", {}).items():
        if not key.startswith(f"{args.label}-"):
            continue
        if "pp" in entry:
            for row in entry["pp"] + entry.get("tg", []):
                print(
                    f"[prefill] {key} p{row['n_prompt']} n{row['n_gen']} ub{row['n_ubatch']}: "
                    f"{row['avg_ts']:.1f} +- {row['stddev_ts']:.1f} tok/s (load {entry['load_before']})",
                    flush=True,
                )
        else:
            print(
                f"[prefill] {key}: first token {entry.get('full_budget_ttft_s_median')} s, "
                f"{entry.get('prompt_tok_s_median')} tok/s, free {entry.get('free_after_load_mib')} / "
                f"{entry.get('free_after_serving_mib')} MiB, {entry.get('error', '')}",
                flush=True,
            )


if __name__ == "__main__":
    main()
