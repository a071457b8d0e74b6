"""One slot or two on the 16 GB card: llama-server alone, in the V100 emulation, full-budget answers.

    (called by bench/gpu/stack.py: step `slots`)

For each profile (the shipped `v100-16g` and the same with one slot, as it shipped before): the card held
down to 16,160 MiB (bench/gpu/hold.py), llama-server started with the profile's flags, then
- one user alone: full-budget answers (3,584 prompt tokens, 512 generated) one after another;
- with two slots, two users at once: `ROUNDS` rounds of two concurrent full-budget answers (2 x ROUNDS
  answers in all), each user's decode rate and the aggregate, and whether the server survived them;
free memory after the load and after serving. Results under "slots" in results-h200.json.
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from driver import ANSWER_TOKENS, PROMPT_TOKENS, V100_MIB, Run, Server, holder, holder_free, holder_stop, vocab_size
from driver import stream_completion as _stream

from rag.deploy.profiles import PROFILES

ROUNDS = 10


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def answer(url: str, prompt: list[int], n_predict: int) -> dict[str, Any]:
    """One full-budget completion: its first token, its decode rate (the server's), its span in time."""
    started = time.perf_counter()
    try:
        first, total, _, timings = _stream(url, prompt, n_predict, cache_prompt=False)
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": str(exc)[:300]}
    return {
        "ttft_s": round(first, 3),
        "started": started,
        "ended": started + total,
        "prompt_n": timings.get("prompt_n"),
        "predicted_n": timings.get("predicted_n"),
        "decode_tok_s": round(timings.get("predicted_per_second", 0.0), 2),
    }


def together(url: str, prompts: list[list[int]], n_predict: int) -> dict[str, Any]:
    """Users asking at the same moment: each one's numbers, and tokens over the time they all took."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        rows = list(pool.map(lambda p: answer(url, p, n_predict), prompts))
    good = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {"users": len(prompts), "errors": [r["error"] for r in rows if "error" in r]}
    if good:
        span = max(r["ended"] for r in good) - min(r["started"] for r in good)
        decode_span = max(r["ended"] for r in good) - max(r["started"] + r["ttft_s"] for r in good)
        out.update(
            per_user_decode_tok_s=[r["decode_tok_s"] for r in good],
            aggregate_decode_tok_s=round(sum(r["decode_tok_s"] for r in good), 2),
            tokens_per_s_over_all=round(sum(r["predicted_n"] or 0 for r in good) / span, 2),
            ttft_s=[r["ttft_s"] for r in good],
            decode_overlap_s=round(decode_span, 2),
            prompt_n=[r["prompt_n"] for r in good],
        )
    return out


def slots(run: Run, model: Path) -> None:
    shipped = PROFILES["v100-16g"]
    one = replace(shipped, name="v100-16g-np1", ctx=shipped.ctx // shipped.parallel, parallel=1, ubatch=512)
    n_vocab = vocab_size(model)
    small = run.dry
    prompt_n, n_predict, rounds = (200, 32, 2) if small else (PROMPT_TOKENS, ANSWER_TOKENS, ROUNDS)
    rng = random.Random(11)

    def prompt() -> list[int]:
        return [rng.randrange(300, n_vocab) for _ in range(prompt_n)]

    for profile in (one, shipped):
        name = f"np{profile.parallel}"
        if run.done("slots", name) or run.left() < 60:
            continue
        flags = profile.flags()
        held = None if small else holder(V100_MIB)
        server = Server(run, model, flags, f"slots-{name}")
        entry: dict[str, Any] = {"profile": profile.name, "flags": flags}
        try:
            if not server.wait_ready(min(150, run.left() - 20)):
                entry["error"] = server.failure()
                continue
            entry["free_after_load_mib"] = holder_free(held)
            entry["buffers_mib"] = server.buffers()
            props = httpx.get(f"{server.url}/props", timeout=10).json()
            entry["props"] = {
                "total_slots": props.get("total_slots"),
                "n_ctx_per_slot": (props.get("default_generation_settings") or {}).get("n_ctx"),
            }
            solo = [answer(server.url, prompt(), n_predict) for _ in range(2 if profile.parallel == 1 else 1)]
            entry["one_user"] = [{k: v for k, v in r.items() if k not in ("started", "ended")} for r in solo]
            entry["one_user_decode_tok_s"] = _median([r["decode_tok_s"] for r in solo if "error" not in r])
            if profile.parallel > 1:
                runs = []
                for _ in range(rounds):
                    if run.left() < 25:
                        entry["cut_short"] = "deadline"
                        break
                    runs.append(together(server.url, [prompt() for _ in range(profile.parallel)], n_predict))
                entry["two_users"] = runs
                answered = sum(len(r.get("per_user_decode_tok_s", [])) for r in runs)
                entry["two_users_summary"] = {
                    "answers": answered,
                    "errors": sum(len(r["errors"]) for r in runs),
                    "aggregate_decode_tok_s_median": _median(
                        [r["aggregate_decode_tok_s"] for r in runs if "aggregate_decode_tok_s" in r]
                    ),
                    "per_user_decode_tok_s_median": _median(
                        [v for r in runs for v in r.get("per_user_decode_tok_s", [])]
                    ),
                    "ttft_s_median": _median([v for r in runs for v in r.get("ttft_s", [])]),
                }
            entry["free_after_serving_mib"] = holder_free(held)
            entry["alive_after_serving"] = server.proc.poll() is None
            log = server.log()
            entry["out_of_memory_lines"] = [
                line[-200:]
                for line in log.splitlines()
                if "out of memory" in line.lower() or "failed to allocate" in line.lower()
            ][:5]
        finally:
            server.stop()
            holder_stop(held)
            run.save("slots", name, entry)
    base = run.results.get("slots", {}).get("np1", {}).get("one_user_decode_tok_s")
    two = run.results.get("slots", {}).get("np2", {}).get("two_users_summary")
    if base and two and two.get("aggregate_decode_tok_s_median"):
        run.save(
            "slots",
            "ratios",
            {
                "aggregate_vs_one_user": round(two["aggregate_decode_tok_s_median"] / base, 3),
                "per_user_vs_one_user": round(two["per_user_decode_tok_s_median"] / base, 3),
            },
        )
