"""Two users on the 16 GB card: llama-server's logical and physical batch (-b / -ub) on the GPU profile.

    python3 bench/gpu/batching.py --bin DIR --model GGUF --out DIR [--deadline EPOCH] [--settings b512-ub256,...]

For each setting, the shipped `v100-16g` flags with only -b, -ub and the K/V cache types changed (flash
attention, two slots of 4,096 tokens), the card held down to 16,160 MiB (bench/gpu/hold.py), the Q4_K_S shape:
- full-budget first token: 3,584 random prompt tokens with nothing cached (three, 16 tokens generated);
- first turns as the API sends them: a 478-token system prefix (then a user-message delimiter, where
  llama-server keeps a checkpoint of the recurrent state) reused, the rest new, whole prompts of 3,584 and
  3,072 tokens (the budget leaving 512 tokens for the follow-up, rag/answering/budget.py);
- rollback: a 3,584-token prompt, then one that shares all but its last D tokens (D = 30, 300, 600) and
  adds 150: how much llama-server reuses (`cache_n`) when a follow-up diverges D tokens before the end;
- one user alone: a full-budget answer (3,584 + 512 generated), the decode rate;
- two users at once: ROUNDS rounds of two full-budget answers started together; and STAGGERED rounds where
  the second starts 2 s after the first (its prompt arrives while the first decodes); per-user decode
  (the server's `predicted_per_second`), the aggregate (their sum) and the tokens over the round's span;
- free memory after loading and after serving.
Results under "batching" in OUT/results-h200.json.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from driver import (  # noqa: E402
    ANSWER_TOKENS,
    PROMPT_TOKENS,
    V100_MIB,
    Run,
    Server,
    holder,
    holder_free,
    holder_stop,
    model_step_parser,
    model_step_run,
    stream_completion,
    vocab_size,
)
from slots import answer, together  # noqa: E402

from rag.deploy.profiles import PROFILES  # noqa: E402

SHIPPED = PROFILES["v100-16g"]
SETTINGS = {  # name: (-b, -ub, -ctk, -ctv)
    "b512-ub256": (512, 256, "q8_0", "q8_0"),
    "b8192-ub256": (8192, 256, "q8_0", "q8_0"),
    "b512-ub512": (512, 512, "q8_0", "q8_0"),
    "b1024-ub1024": (1024, 1024, "q8_0", "q8_0"),
    "b256-ub256": (256, 256, "q8_0", "q8_0"),
    "b2048-ub2048": (2048, 2048, "q8_0", "q8_0"),
    "b8192-ub512": (8192, 512, "q8_0", "q8_0"),
    # a q4_0 V cache: 64 MiB less for the two slots, what lets -ub 512 fit a V100's margin
    "b8192-ub512-v4": (8192, 512, "q8_0", "q4_0"),
    "b8192-ub512-kv4": (8192, 512, "q4_0", "q4_0"),
}
ROUNDS = 3
STAGGERED = 1
SYSTEM_TOKENS = 478  # the API's system prompt and template on this model's tokenizer (bench/README.md)
ROOM = 512  # what the budget leaves a first turn's follow-up


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def with_batch(flags: list[str], batch: int, ubatch: int, cache_k: str, cache_v: str) -> list[str]:
    out = list(flags)
    for flag, value in (("-b", batch), ("-ub", ubatch), ("-ctk", cache_k), ("-ctv", cache_v)):
        out[out.index(flag) + 1] = str(value)
    return out


def timed(url: str, prompt: list[int], n_predict: int, delimiters: list[dict[str, str]] | None) -> dict[str, Any]:
    """One streamed /completion with the prompt cache on: first token, what was reused and processed."""
    extra = {"message_delimiters": delimiters} if delimiters else None
    first, _, _, timings = stream_completion(url, prompt, n_predict, cache_prompt=True, extra=extra)
    prompt_n, cache_n = timings.get("prompt_n"), timings.get("cache_n")
    return {
        "ttft_s": round(first, 3),
        "prompt_n": prompt_n,
        "cache_n": cache_n,
        "reuse": round(cache_n / (cache_n + prompt_n), 3) if prompt_n is not None and cache_n is not None else None,
        "prompt_tok_s": round(timings.get("prompt_per_second", 0.0), 1),
    }


def user_delimiter(url: str) -> tuple[list[int], list[dict[str, str]]]:
    """The token ids of ChatML's user-message start, and the delimiters that make llama-server find it."""
    text = "<|im_start|>user\n"
    ids = httpx.post(f"{url}/tokenize", json={"content": text, "parse_special": True}, timeout=30).json()["tokens"]
    return [int(t) for t in ids], [{"role": "user", "delimiter": text}]


def staggered(url: str, prompts: list[list[int]], n_predict: int, delay: float) -> dict[str, Any]:
    """The second user's prompt arrives `delay` s after the first's (while the first decodes)."""
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(answer, url, prompts[0], n_predict)
        time.sleep(delay)
        second = pool.submit(answer, url, prompts[1], n_predict)
        rows = [first.result(), second.result()]
    good = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {"errors": [r["error"] for r in rows if "error" in r]}
    if len(good) == 2:
        span = max(r["ended"] for r in good) - min(r["started"] for r in good)
        out.update(
            per_user_decode_tok_s=[r["decode_tok_s"] for r in good],
            aggregate_decode_tok_s=round(sum(r["decode_tok_s"] for r in good), 2),
            tokens_per_s_over_all=round(sum(r["predicted_n"] or 0 for r in good) / span, 2),
            ttft_s=[r["ttft_s"] for r in good],
        )
    return out


def setting(run: Run, model: Path, name: str, n_vocab: int) -> None:
    if run.done("batching", name) or run.left() < 90:
        return
    small = run.dry
    prompt_n, n_predict = (200, 16) if small else (PROMPT_TOKENS, ANSWER_TOKENS)
    system_n = 40 if small else SYSTEM_TOKENS
    rng = random.Random(hash(name) & 0xFFFF)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(300, n_vocab) for _ in range(n)]

    batch, ubatch, cache_k, cache_v = SETTINGS[name]
    flags = with_batch(SHIPPED.flags(), batch, ubatch, cache_k, cache_v)
    held = None if small else holder(V100_MIB)
    server = Server(run, model, flags, f"batching-{name}")
    entry: dict[str, Any] = {"batch": batch, "ubatch": ubatch, "cache_k": cache_k, "cache_v": cache_v, "flags": flags}
    try:
        if not server.wait_ready(min(180, run.left() - 30)):
            entry["error"] = server.failure()
            return
        entry["free_after_load_mib"] = holder_free(held)
        entry["buffers_mib"] = server.buffers()
        timed(server.url, tokens(64), 4, None)  # warm-up
        fresh = [timed(server.url, tokens(prompt_n), 16, None) for _ in range(3)]
        entry["full_budget_fresh"] = fresh
        entry["full_budget_ttft_s_median"] = _median([r["ttft_s"] for r in fresh])

        delim_ids, delims = user_delimiter(server.url)
        system = tokens(system_n) + delim_ids
        timed(server.url, system + tokens(64), 4, delims)  # the system prefix and its checkpoint
        turns: dict[str, Any] = {}
        for total in (prompt_n, prompt_n - (64 if small else ROOM)):
            rows = [timed(server.url, system + tokens(total - len(system)), 16, delims) for _ in range(2)]
            turns[str(total)] = {"runs": rows, "ttft_s_median": _median([r["ttft_s"] for r in rows])}
        entry["first_turns"] = turns

        rollback: dict[str, Any] = {}
        for depth in (8, 60, 120) if small else (30, 300, 600):
            first_prompt = system + tokens(prompt_n - len(system))
            timed(server.url, first_prompt, 16, delims)
            follow = first_prompt[: len(first_prompt) - depth] + tokens(150)
            rollback[str(depth)] = timed(server.url, follow, 16, delims)
        entry["rollback"] = rollback

        solo = answer(server.url, tokens(prompt_n), n_predict)
        entry["one_user"] = {k: v for k, v in solo.items() if k not in ("started", "ended")}
        base = solo.get("decode_tok_s")

        rounds = []
        for _ in range(2 if small else ROUNDS):
            if run.left() < 25:
                entry["cut_short"] = "deadline"
                break
            rounds.append(together(server.url, [tokens(prompt_n), tokens(prompt_n)], n_predict))
        entry["two_users"] = rounds
        stag = []
        for _ in range(1 if small else STAGGERED):
            if run.left() < 25:
                entry["cut_short"] = "deadline"
                break
            stag.append(staggered(server.url, [tokens(prompt_n), tokens(prompt_n)], n_predict, 0.5 if small else 2.0))
        entry["two_users_staggered"] = stag
        agg = _median([r.get("aggregate_decode_tok_s") for r in rounds])
        entry["summary"] = {
            "full_budget_ttft_s": entry["full_budget_ttft_s_median"],
            "first_turn_ttft_s": {k: v["ttft_s_median"] for k, v in turns.items()},
            "rollback_reuse": {k: v["reuse"] for k, v in rollback.items()},
            "one_user_decode_tok_s": base,
            "two_users_per_user_tok_s_median": _median([v for r in rounds for v in r.get("per_user_decode_tok_s", [])]),
            "two_users_aggregate_tok_s_median": agg,
            "two_users_over_all_tok_s_median": _median([r.get("tokens_per_s_over_all") for r in rounds]),
            "two_users_ttft_s": [v for r in rounds for v in r.get("ttft_s", [])],
            "aggregate_vs_one_user": round(agg / base, 3) if agg and base else None,
            "staggered_per_user_tok_s": [v for r in stag for v in r.get("per_user_decode_tok_s", [])],
            "staggered_aggregate_tok_s_median": _median([r.get("aggregate_decode_tok_s") for r in stag]),
            "errors": sum(len(r.get("errors", [])) for r in rounds + stag),
        }
        entry["free_after_serving_mib"] = holder_free(held)
        entry["alive_after_serving"] = server.proc.poll() is None
    except Exception as exc:  # noqa: BLE001 - a benchmark keeps what it measured and reports the rest
        entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
    finally:
        server.stop()
        holder_stop(held)
        run.save("batching", name, entry)


def main() -> None:
    parser = model_step_parser(__doc__)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    args = parser.parse_args()
    run = model_step_run(args)
    n_vocab = vocab_size(args.model)
    for name in args.settings.split(","):
        setting(run, args.model, name, n_vocab)
        summary = run.results.get("batching", {}).get(name, {}).get("summary")
        print(f"[batching] {name}: {summary}", flush=True)


if __name__ == "__main__":
    main()
