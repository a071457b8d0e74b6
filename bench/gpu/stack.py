"""The whole stack in front of the GPU llama-server: `rag up` on the GPU profile, a real corpus ingested
with the `ingest` CLI, then what a user sees.

    python3 bench/gpu/stack.py --bin DIR --model GGUF --embedder DIR --corpus DIR --out DIR [--deadline EPOCH]

Steps (results under "stack" in OUT/results-h200.json, saved after each):
  cache_ram    llama-server alone, the shipped flags with and without `--cache-ram 0`: new ~3,000-token
               questions after a shared system prefix, and returns to an earlier question (what the host
               prompt cache buys back);
  whole_card   `rag up` (profile from RAG_LLM_PROFILE, default v100-16g), `ingest CORPUS`, then stream
               fidelity (API vs llama-server direct), full-budget answers (top_k 16, 512 tokens),
               follow-up turns, the `openai` SDK against /v1;
  no_cutoff    the same full-budget answers with the packing cut-off off (before/after);
  emulation    the card held down to a V100's 16,160 MiB (bench/gpu/hold.py), the stack started again
               (embedder on the CPU), full-budget answers and follow-ups;
  slots        llama-server alone in the 16 GB emulation, one slot vs the shipped two (bench/gpu/slots.py);
  emulation_np2  the stack in the 16 GB emulation on the shipped two-slot profile: ingest, follow-ups
               whose history is the whole first answer (top_k 16 and 4), two users at once.
`--dry-run` runs on a CPU with a toy model (smaller prompts and answers, no memory held).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
PACKED_EMBEDDER = "all-MiniLM-L6-v2"
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from driver import (  # noqa: E402
    V100_MIB,
    Run,
    Server,
    free_port,
    holder,
    holder_free,
    holder_stop,
    stream_completion,
    vocab_size,
)
from slots import slots  # noqa: E402

from bench.stream_fidelity import measure, sse, summary  # noqa: E402
from rag.deploy.profiles import PROFILES  # noqa: E402

PROFILE = os.environ.get("RAG_LLM_PROFILE", "v100-16g")
CUTOFF_SETTING = "RAG_PACK_RELATIVE_SCORE"


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


# --- llama-server alone: what --cache-ram costs and buys -----------------------------------------


def timed_completion(url: str, prompt: list[int], n_predict: int) -> dict[str, Any]:
    first, _, _, timings = stream_completion(url, prompt, n_predict, cache_prompt=True)
    return {
        "ttft_ms": round(1000 * first, 1),
        "prompt_n": timings.get("prompt_n"),
        "cache_n": timings.get("cache_n"),
        "prompt_ms": round(timings.get("prompt_ms", 0.0), 1),
    }


def cache_ram(run: Run, model: Path) -> None:
    """New questions (a shared 700-token system prefix + ~2,900 new tokens) and returns to earlier ones."""
    shipped = PROFILES[PROFILE].flags()
    default = shipped[: shipped.index("--cache-ram")] + shipped[shipped.index("--cache-ram") + 2 :]
    n_vocab = vocab_size(model)
    rng = random.Random(7)
    system, body = (64, 192) if run.dry else (700, 2900)
    prefix = [rng.randrange(300, n_vocab) for _ in range(system)]
    questions = [prefix + [rng.randrange(300, n_vocab) for _ in range(body)] for _ in range(4)]
    # a b c (new), a (return), d (new), b (return), c (return)
    order = [(0, "new"), (1, "new"), (2, "new"), (0, "return"), (3, "new"), (1, "return"), (2, "return")]
    for name, flags in (("cache_ram_default", default), ("cache_ram_0", shipped)):
        if run.done("stack", name) or run.left() < 60:
            continue
        server = Server(run, model, flags, name)
        entry: dict[str, Any] = {"flags": flags}
        try:
            if not server.wait_ready(min(120, run.left() - 20)):
                entry["error"] = server.failure()
            else:
                timed_completion(server.url, prefix[:16], 4)
                entry["runs"] = [
                    {"kind": kind, "question": q, **timed_completion(server.url, questions[q], 8)} for q, kind in order
                ]
                for kind in ("new", "return"):
                    rows = [r for r in entry["runs"] if r["kind"] == kind]
                    entry[f"{kind}_ttft_ms_median"] = median([r["ttft_ms"] for r in rows])
                    entry[f"{kind}_prompt_n_median"] = median([r["prompt_n"] for r in rows])
                    # Time not spent processing the prompt: the pre-prompt gap lives here.
                    entry[f"{kind}_outside_prompt_ms_median"] = median([r["ttft_ms"] - r["prompt_ms"] for r in rows])
        finally:
            server.stop()
        run.save("stack", name, entry)


# --- the stack -----------------------------------------------------------------------------------


class Stack:
    """`rag up` as a user starts it, with the benchmark's paths."""

    def __init__(self, run: Run, args: argparse.Namespace, name: str, env: dict[str, str]) -> None:
        self.data = Path(args.out) / "stack-data"
        self.logs = run.logs / f"stack-{name}"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
        self.env.update(
            RAG_DATA_DIR=str(self.data),
            RAG_LLM_PROFILE=PROFILE,
            RAG_LLM_SERVER_BIN=str(Path(args.bin) / "llama-server"),
            RAG_LLM_MODEL_PATH=str(args.model),
            RAG_LLM_MODEL="qwen3.6-27b",
            # The packed embedder is MiniLM (bench/gpu/embedder_pack.py): named as what it is, or the stack
            # would serve it under the default embedder's name and its relevance floors would refuse everything.
            RAG_EMBED_MODEL=PACKED_EMBEDDER,
            RAG_EMBED_MODEL_PATH=str(args.embedder),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
        )
        if args.dry_run:
            self.env.update(RAG_LLM_PROFILE="cpu", RAG_EMBED_DEVICE="cpu")
        ports = [free_port() for _ in range(3)]
        self.api, self.llm = f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
        self.env.update(RAG_API_PORT=str(ports[0]), RAG_LLM_URL=self.llm, RAG_EMBED_URL=f"http://127.0.0.1:{ports[2]}")
        self.env.update(env)
        log = (self.logs / "rag-up.log").open("wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rag.cli", "up"],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float) -> float | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            try:
                if httpx.get(f"{self.api}/health", timeout=2).status_code == 200:
                    return round(time.monotonic() - self.started, 1)
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        return None

    def ingest(self, corpus: Path) -> dict[str, Any]:
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ingest.cli",
                str(corpus),
                "--recursive",
                "--glob",
                "*.txt",
                "--json",
                "--server",
                self.api,
            ],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        (self.logs / "ingest.log").write_text(done.stdout + "\n" + done.stderr)
        summary_ = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip().startswith("{") else {}
        return {"rc": done.returncode, "seconds": round(time.monotonic() - started, 1), "summary": summary_}

    def first_answer_sources(self, question: str) -> int:
        """How many sources the stack's answer to a corpus question has (0: the fixed refusal)."""
        body = {"messages": [{"role": "user", "content": question}], "stream": False, "max_tokens": 8}
        try:
            answer = httpx.post(f"{self.api}/v1/chat", json=body, timeout=300).json()
        except (httpx.HTTPError, ValueError):
            return 0
        return len(answer.get("sources") or [])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for log in (self.data / "logs").glob("*.log"):
            (self.logs / log.name).write_bytes(log.read_bytes()[-2_000_000:])


async def chat(
    http: httpx.AsyncClient, api: str, messages: list[dict[str, str]], top_k: int, max_tokens: int
) -> dict[str, Any]:
    """One /v1/chat answer: client TTFT and decode, and what the API reports in its events."""
    body = {"messages": messages, "top_k": top_k, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    started = time.perf_counter()
    stamps: list[float] = []
    text: list[str] = []
    events: dict[str, Any] = {}
    async for name, data in sse(http, f"{api}/v1/chat", body):
        if name == "token":
            stamps.append(time.perf_counter())
            text.append(data.get("text", "") if isinstance(data, dict) else str(data))
        else:
            events[name] = data
    done = events.get("done", {})
    timings = done.get("timings") or {}
    prompt_n, cache_n = timings.get("prompt_n"), timings.get("cache_n")
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {
        "ttft_ms": round((stamps[0] - started) * 1000, 1) if stamps else None,
        "tokens": len(stamps),
        "decode_tps": round((len(stamps) - 1) / span, 1) if span else None,
        "budget_used": (events.get("budget") or {}).get("used"),
        "sources": len((events.get("sources") or {}).get("sources", [])),
        "prompt_n": prompt_n,
        "cache_n": cache_n,
        "reuse": round(cache_n / (cache_n + prompt_n), 3) if prompt_n is not None and cache_n is not None else None,
        "prompt_tps": round(timings.get("prompt_per_second") or 0.0, 1),
        "server_decode_tps": round(timings.get("predicted_per_second") or 0.0, 1),
        "retrieval_ms": done.get("retrieval_ms"),
        "pack_ms": done.get("pack_ms"),
        "upstream_ttft_ms": done.get("upstream_ttft_ms"),
        "error": events.get("error"),
        "answer": "".join(text),
    }


def digest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = (
        "ttft_ms",
        "decode_tps",
        "budget_used",
        "sources",
        "prompt_n",
        "cache_n",
        "reuse",
        "prompt_tps",
        "server_decode_tps",
        "retrieval_ms",
        "pack_ms",
        "upstream_ttft_ms",
    )
    out = {f"{k}_median": median([r.get(k) for r in rows]) for k in keys}
    out["answered"] = sum(1 for r in rows if r.get("tokens") and not r.get("error"))
    out["n"] = len(rows)
    return out


async def full_budget(api: str, questions: list[str], max_tokens: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=600) as http:
        rows = [await chat(http, api, [{"role": "user", "content": q}], 16, max_tokens) for q in questions]
    for row in rows:
        row.pop("answer")
    return {"summary": digest(rows), "runs": rows}


async def follow_ups(
    api: str, questions: list[str], top_k: int, max_tokens: int, keep_chars: int | None = 400
) -> dict[str, Any]:
    """A question, then a follow-up turn that asks it again (so it re-retrieves the same sources);
    the history carries the first answer's first `keep_chars` characters (None: all of it, as a chat client does)."""
    firsts, seconds = [], []
    async with httpx.AsyncClient(timeout=600) as http:
        for q in questions:
            first = await chat(http, api, [{"role": "user", "content": q}], top_k, max_tokens)
            history = [
                {"role": "user", "content": q},
                {"role": "assistant", "content": first.pop("answer")[:keep_chars]},
                {"role": "user", "content": q},
            ]
            second = await chat(http, api, history, top_k, max_tokens)
            second.pop("answer")
            firsts.append(first)
            seconds.append(second)
    return {"top_k": top_k, "first": digest(firsts), "follow_up": digest(seconds), "runs": seconds}


async def two_at_once(api: str, questions: list[str], max_tokens: int) -> dict[str, Any]:
    """Two users asking full-budget questions at the same moment through /v1/chat, round after round."""
    rounds = []
    async with httpx.AsyncClient(timeout=600) as http:
        for a, b in zip(questions[::2], questions[1::2]):
            pair = await asyncio.gather(
                *(chat(http, api, [{"role": "user", "content": q}], 16, max_tokens) for q in (a, b))
            )
            for row in pair:
                row.pop("answer")
            rounds.append(pair)
    rows = [row for pair in rounds for row in pair]
    return {
        "summary": digest(rows),
        "aggregate_decode_tps": [sum(r["decode_tps"] or 0 for r in p) for p in rounds],
        "runs": rows,
    }


def openai_sdk(api: str, question: str, max_tokens: int) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{api}/v1", api_key="unused")
    started = time.perf_counter()
    first, chunks, text = None, 0, []
    stream = client.chat.completions.create(
        model="qwen3.6-27b", messages=[{"role": "user", "content": question}], max_tokens=max_tokens, stream=True
    )
    for chunk in stream:
        chunks += 1
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first = first or time.perf_counter() - started
            text.append(delta)
    whole = client.chat.completions.create(
        model="qwen3.6-27b", messages=[{"role": "user", "content": question}], max_tokens=16
    )
    return {
        "stream_chunks": chunks,
        "stream_ttft_ms": round(1000 * (first or 0.0), 1),
        "stream_chars": len("".join(text)),
        "non_stream_finish": whole.choices[0].finish_reason,
        "non_stream_usage": whole.usage.model_dump() if whole.usage else None,
    }


def stack_phase(
    run: Run,
    args: argparse.Namespace,
    name: str,
    questions: list[str],
    env: dict[str, str],
    steps: tuple[str, ...],
    hold: bool = False,
) -> None:
    if run.done("stack", name) or run.left() < 90:
        return
    small = args.dry_run
    tokens = 32 if small else 512
    held = holder(V100_MIB) if hold and not small else None
    stack = Stack(run, args, name, env)
    entry: dict[str, Any] = {"profile": stack.env["RAG_LLM_PROFILE"], "env": env}
    try:
        entry["ready_s"] = stack.wait_ready(min(300, run.left() - 30))
        if entry["ready_s"] is None:
            entry["error"] = "the stack did not become ready"
            return
        entry["free_after_start_mib"] = holder_free(held)
        if "ingest" in steps:
            entry["ingest"] = stack.ingest(Path(args.corpus))
            run.save("stack", f"{name}-partial", entry)
        entry["first_answer_sources"] = stack.first_answer_sources(questions[0])
        if not entry["first_answer_sources"]:
            # Nothing below would measure what ships: an answer without sources is the fixed refusal.
            entry["error"] = "the stack's first answer has no sources (embedder, floor or corpus wrong)"
            return
        if "fidelity" in steps:
            fid_args = SimpleNamespace(max_tokens=32 if small else 256)
            pairs = asyncio.run(
                measure(fid_args, stack.api, stack.llm, questions[: 4 if small else 12], stack.proc.pid)
            )
            entry["stream_fidelity"] = {"top_k": int(env.get("RAG_TOP_K", 8)), **summary(pairs)}
            run.save("stack", f"{name}-partial", entry)
        if "full" in steps:
            entry["full_budget"] = asyncio.run(full_budget(stack.api, questions[12 : 14 if small else 19], tokens))
            run.save("stack", f"{name}-partial", entry)
        if "follow" in steps:  # TTFT and reuse are what count here: short answers
            entry["follow_up"] = asyncio.run(follow_ups(stack.api, questions[20 : 22 if small else 25], 16, 64))
            entry["follow_up_top4"] = asyncio.run(follow_ups(stack.api, questions[30 : 32 if small else 34], 4, 64))
            run.save("stack", f"{name}-partial", entry)
        if "kept" in steps:  # follow-ups whose history is the whole first answer, as a chat client sends it
            entry["follow_up"] = asyncio.run(follow_ups(stack.api, questions[20 : 22 if small else 26], 16, 64, None))
            entry["follow_up_top4"] = asyncio.run(
                follow_ups(stack.api, questions[30 : 32 if small else 35], 4, 64, None)
            )
            run.save("stack", f"{name}-partial", entry)
        if "two" in steps:
            entry["two_at_once"] = asyncio.run(two_at_once(stack.api, questions[40 : 44 if small else 46], tokens))
            run.save("stack", f"{name}-partial", entry)
        if "openai" in steps:
            entry["openai_sdk"] = openai_sdk(stack.api, questions[40], 32 if small else 128)
        entry["free_after_serving_mib"] = holder_free(held)
        entry["llm_alive"] = httpx.get(f"{stack.llm}/health", timeout=5).status_code == 200
    except Exception as exc:  # noqa: BLE001 - a benchmark keeps what it measured and reports the rest
        entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
    finally:
        stack.stop()
        holder_stop(held)
        run.results.get("stack", {}).pop(f"{name}-partial", None)
        run.save("stack", name, entry)


def without_cache_ram_flag(binary: Path, out: Path) -> Path:
    """A llama-server that ignores `--cache-ram N`: the profile as it was before that flag."""
    wrapper = out / "llama-server-default-cache-ram"
    wrapper.write_text(
        "#!/usr/bin/env bash\nargs=()\nwhile [ $# -gt 0 ]; do\n"
        '  if [ "$1" = --cache-ram ]; then shift 2; continue; fi\n  args+=("$1"); shift\ndone\n'
        f'exec {binary} "${{args[@]}}"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--embedder", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--steps", default="cache_ram,whole_card,emulation,no_cutoff")
    args = parser.parse_args()
    run = Run(
        SimpleNamespace(
            bin=args.bin, models=str(args.model.parent), out=args.out, deadline=args.deadline, dry_run=args.dry_run
        )
    )
    questions = json.loads((Path(args.corpus) / "questions.json").read_text())
    steps = args.steps.split(",")
    if "slots" in steps:
        slots(run, args.model)
    if "emulation_np2" in steps:  # the shipped two-slot profile in 16 GB: follow-ups with the history, two users
        stack_phase(
            run, args, "emulation_np2", questions, {"RAG_EMBED_DEVICE": "cpu"}, ("ingest", "kept", "two"), hold=True
        )
    if "cache_ram" in steps:
        cache_ram(run, args.model)
    if "whole_card" in steps:
        stack_phase(
            run, args, "whole_card", questions, {"RAG_TOP_K": "2"}, ("ingest", "fidelity", "full", "follow", "openai")
        )
    if "emulation" in steps:
        stack_phase(run, args, "emulation_16g", questions, {"RAG_EMBED_DEVICE": "cpu"}, ("full", "follow"), hold=True)
    if "no_cutoff" in steps:
        stack_phase(run, args, "no_cutoff", questions, {CUTOFF_SETTING: "0"}, ("full",))
    # Before/after in one run: the shipped profile and packing, then the host prompt cache back on
    # (llama-server's default) and the cut-off off, on the same index and questions.
    if "after" in steps:
        stack_phase(run, args, "after", questions, {}, ("ingest", "full", "follow"))
    if "before" in steps:
        before = {
            "RAG_LLM_SERVER_BIN": str(without_cache_ram_flag(Path(args.bin) / "llama-server", Path(args.out))),
            CUTOFF_SETTING: "0",
        }
        stack_phase(run, args, "before", questions, before, ("full", "follow"))


if __name__ == "__main__":
    main()
