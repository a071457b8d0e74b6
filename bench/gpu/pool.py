"""Several users on one GPU: one llama-server with two slots (`-np 2`) against two one-slot llama-servers sharing
the card behind one pool (rag.clients.llm_pool), at 1, 2 and 4 users at once.

    python3 bench/gpu/pool.py --bin DIR --model GGUF --out DIR [--deadline EPOCH] [--dry-run]

Each user streams --rounds completions one after another, each of --prompt random token ids (a full-budget
prompt: no prefix shared, so nothing is reused) and --predict tokens (ignore_eos), through the pool's
`stream_completion` as the API sends answers. Per configuration and user count: TTFT p50/p95, per-user decode
tok/s (llama-server's `predicted_per_second`), aggregate tok/s (every answer's tokens / the round's wall time).

Configurations (the shipped v100-16g flags, rag/deploy/profiles.py, otherwise):
  np2_whole_card     one server, -np 2, -c 8192 (4,096 per slot), the whole card;
  two_servers        two servers, -np 1, -c 4,096 each, both on the card, behind one pool;
  np2_16g            one server, -np 2, in the 16 GB emulation (bench/gpu/hold.py): does a second slot fit?
Two servers do not fit in 16 GB at all (two copies of the weights): that one is not tried.
Results under "pool" in OUT/results-h200.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from driver import (  # noqa: E402
    V100_MIB,
    Run,
    Server,
    holder,
    holder_free,
    holder_stop,
    model_step_parser,
    model_step_run,
    vocab_size,
)

from rag.clients.llm import StreamEnd  # noqa: E402
from rag.clients.llm_pool import LlamaServerPool  # noqa: E402
from rag.deploy.profiles import PROFILES  # noqa: E402

SHIPPED = PROFILES["v100-16g"].flags()


def with_slots(flags: list[str], slots: int) -> list[str]:
    """The flags with -np `slots` and -c 4,096 per slot."""
    out = list(flags)
    out[out.index("-np") + 1] = str(slots)
    out[out.index("-c") + 1] = str(4096 * slots)
    return out


async def one_round(
    pool: LlamaServerPool, users: int, args: argparse.Namespace, n_vocab: int, seed: int = 0
) -> dict[str, Any]:
    ttft: list[float] = []
    decode: list[float] = []
    tokens = 0

    async def user(u: int) -> None:
        nonlocal tokens
        rng = random.Random(u * 1000 + users + seed)
        for _ in range(args.rounds):
            prompt = [rng.randrange(300, n_vocab) for _ in range(args.prompt)]
            started = time.perf_counter()
            first = None
            stream = pool.stream_completion(prompt, max_tokens=args.predict, extra={"ignore_eos": True})  # type: ignore[arg-type]
            async for item in stream:
                if isinstance(item, StreamEnd):
                    decode.append(float(item.timings.get("predicted_per_second") or 0.0))
                    tokens += int(item.timings.get("predicted_n") or 0)
                elif first is None:
                    first = time.perf_counter() - started
            ttft.append(first or 0.0)

    started = time.perf_counter()
    await asyncio.gather(*(user(u) for u in range(users)))
    wall = time.perf_counter() - started
    ttft.sort()
    return {
        "users": users,
        "answers": len(decode),
        "wall_s": round(wall, 2),
        "ttft_ms_p50": round(1000 * statistics.median(ttft), 1),
        "ttft_ms_p95": round(1000 * ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))], 1),
        "per_user_decode_tok_s_p50": round(statistics.median(decode), 2),
        "aggregate_tok_s": round(tokens / wall, 2),
    }


def configuration(run: Run, args: argparse.Namespace, name: str, flags: list[str], servers: int, hold: bool) -> None:
    if run.done("pool", name) or run.left() < 60:
        return
    held = holder(V100_MIB) if hold and not args.dry_run else None
    started = [Server(run, args.model, flags, f"pool-{name}-{i}") for i in range(servers)]
    entry: dict[str, Any] = {"servers": servers, "flags": flags}
    try:
        if not all(s.wait_ready(min(240, run.left() - 20)) for s in started):
            entry["error"] = "did not load: " + " | ".join(s.failure() for s in started)[-600:]
            return
        entry["free_after_load_mib"] = holder_free(held)
        entry["rounds"] = asyncio.run(measure(run, args, [s.url for s in started]))
        entry["free_after_serving_mib"] = holder_free(held)
    except Exception as exc:  # noqa: BLE001 - a benchmark keeps what it measured and reports the rest
        entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
    finally:
        for server in started:
            server.stop()
        holder_stop(held)
        run.save("pool", name, entry)


async def measure(run: Run, args: argparse.Namespace, urls: list[str]) -> list[dict[str, Any]]:
    pool = LlamaServerPool(urls, timeout=600)
    n_vocab = vocab_size(args.model)
    rounds = []
    try:
        await pool.check()
        # A warm-up of other prompts (the same ones would be served from the slot's cache).
        await one_round(pool, 1, argparse.Namespace(**{**vars(args), "rounds": 1}), n_vocab, seed=500)
        for users in args.users:
            if run.left() < 20:
                break
            rounds.append(await one_round(pool, users, args, n_vocab))
            print(f"[pool] {urls}: {rounds[-1]}", flush=True)
    finally:
        await pool.aclose()
    return rounds


def main() -> None:
    parser = model_step_parser(__doc__)
    parser.add_argument("--users", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=3000, help="prompt tokens of each answer")
    parser.add_argument("--predict", type=int, default=256, help="tokens of each answer")
    parser.add_argument("--configs", default="np2_whole_card,two_servers,np2_16g")
    args = parser.parse_args()
    if args.dry_run:
        args.prompt, args.predict = min(args.prompt, 200), min(args.predict, 16)
    run = model_step_run(args)
    flags = SHIPPED
    wanted = args.configs.split(",")
    if "np2_whole_card" in wanted:
        configuration(run, args, "np2_whole_card", with_slots(flags, 2), 1, hold=False)
    if "two_servers" in wanted:
        configuration(run, args, "two_servers", with_slots(flags, 1), 2, hold=False)
    if "np2_16g" in wanted:
        configuration(run, args, "np2_16g", with_slots(flags, 2), 1, hold=True)
    run.save("pool", "two_servers_16g", {"skipped": "two copies of the weights do not fit in 16,160 MiB"})


if __name__ == "__main__":
    main()
