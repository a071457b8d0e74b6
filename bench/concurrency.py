"""Concurrency: 1, 2, 4, 8 users at once through /v1/chat, one llama-server against a pool of two; follow-ups
sent back to their server; one server of the pool killed under load.

    .venv/bin/python -m bench.concurrency                          # 1 and 2 servers, 1 2 4 8 users, the kill
    .venv/bin/python -m bench.concurrency --servers 2 --users 4 --skip-kill     # one configuration
    .venv/bin/python -m bench.concurrency --llm-url http://h:8081,http://h:8082 --servers 2   # servers already up

Everything runs for real as subprocesses on free ports: the llama-servers (the bundled Gemma 3 270M on the
cpu profile, one slot and one thread each, unless RAG_LLM_MODEL_PATH / RAG_LLM_PROFILE say otherwise, or
--llm-url names running ones), the embedding server and the API (`rag serve-api`, chat prompt style, default
backpressure). The questions are SQuAD's about the indexed article, asked at --top-k so that the sources
fill the prompt budget, each answer up to --max-tokens.

Users: for N users, N tasks each ask --rounds questions one after another (streamed); a 429 is counted and
that request is not retried. Per N: answers, 429 share, errors, TTFT p50/p95 (request sent -> first token,
as the user sees it), per-user decode tok/s (llama-server's `predicted_per_second` of each answer: the speed
a user reads at), aggregate tok/s (every answer's completion tokens / the wall time of the round: what the
stack serves), and the prompt tokens llama-server reused.

Follow-ups: two conversations interleaved (A1 B1 A2 B2 A3 B3, each turn the history so far): on one
one-slot server each follow-up finds the other conversation's prompt in the slot; in a pool each goes back
to the server of its previous turn. Reported: the share of the follow-ups' prompt reused (cache_n).

Kill (pool only): --kill-users users stream long answers; once both servers stream tokens, one is killed with
SIGKILL. Its streams must end with an `error` event within 2 s; the chats after it must go on (no 500). A
request still in its prefill there moves to the other server unseen, so the kill waits for tokens.

Results: printed, and bench/results/concurrency.json (with provenance and the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header, write_json  # noqa: E402
from bench._servers import start_generator  # noqa: E402
from bench.load import seed, squad_article  # noqa: E402
from bench.scale import clean_env  # noqa: E402
from rag.eval.harness import latency_summary  # noqa: E402

RESULTS = ROOT / "bench" / "results"
COLLECTION = "loadchat"
ERROR_WITHIN_S = 2.0


@dataclass
class Tally:
    requests: int = 0
    answered: int = 0
    busy: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft_ms: list[float] = field(default_factory=list)
    decode_tok_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    cached: int = 0
    prompt: int = 0
    error_at: list[float] = field(default_factory=list)  # perf_counter of each `error` event
    streaming: int = 0  # answers between their first token and their end, now

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def answer(self, done: dict[str, Any]) -> None:
        self.answered += 1
        timings = done.get("timings") or {}
        if timings.get("predicted_per_second"):
            self.decode_tok_s.append(float(timings["predicted_per_second"]))
        self.completion_tokens += int((done.get("usage") or {}).get("completion_tokens") or 0)
        cached, new = int(timings.get("cache_n") or 0), int(timings.get("prompt_n") or 0)
        self.cached, self.prompt = self.cached + cached, self.prompt + cached + new


async def chat(
    client: httpx.AsyncClient, messages: list[dict[str, str]], args: argparse.Namespace, tally: Tally
) -> str:
    """One streamed chat; its answer text ('' when it did not finish)."""
    body = {
        "messages": messages,
        "collection": COLLECTION,
        "top_k": args.top_k,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    tally.requests += 1
    started, first, event, parts = time.perf_counter(), None, "", []
    try:
        async with client.stream("POST", "/v1/chat", json=body) as response:
            if response.status_code == 429:
                tally.busy += 1
                return ""
            if response.status_code != 200:
                tally.error(f"HTTP {response.status_code}")
                return ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "token":
                    if first is None:
                        first = time.perf_counter()
                        tally.streaming += 1
                    parts.append(json.loads(line[5:])["text"])
                elif line.startswith("data:") and event == "done":
                    tally.answer(json.loads(line[5:]))
                    if first is not None:
                        tally.ttft_ms.append((first - started) * 1000)
                    return "".join(parts)
                elif line.startswith("data:") and event == "error":
                    tally.error_at.append(time.perf_counter())
                    tally.error(json.loads(line[5:]).get("code", "error_event"))
                    return ""
        tally.error("stream ended without done")
    except httpx.HTTPError as exc:
        tally.error(exc.__class__.__name__)
    finally:
        tally.streaming -= first is not None
    return ""


async def users(api_url: str, n: int, args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    tally = Tally()
    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(base_url=api_url, timeout=httpx.Timeout(600, connect=10), limits=limits) as client:

        async def one_user(u: int) -> None:
            for r in range(args.rounds):
                question = questions[(u * args.rounds + r) % len(questions)]
                await chat(client, [{"role": "user", "content": question}], args, tally)

        started = time.perf_counter()
        await asyncio.gather(*(one_user(u) for u in range(n)))
        wall = time.perf_counter() - started
    return {
        "users": n,
        "requests": tally.requests,
        "answered": tally.answered,
        "share_429": round(tally.busy / tally.requests, 3) if tally.requests else 0.0,
        "errors": tally.errors,
        "wall_s": round(wall, 1),
        "ttft_ms": latency_summary(tally.ttft_ms),
        "per_user_decode_tok_s_p50": _median(tally.decode_tok_s),
        "aggregate_tok_s": round(tally.completion_tokens / wall, 2),
        "completion_tokens": tally.completion_tokens,
        "prompt_reuse": round(tally.cached / tally.prompt, 3) if tally.prompt else None,
        "prompt_tokens_per_answer": round(tally.prompt / tally.answered) if tally.answered else None,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


async def followups(api_url: str, args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    """Two conversations interleaved, three turns each: the share of the follow-ups' prompt reused."""
    first, later = Tally(), Tally()
    conversations: list[list[dict[str, str]]] = [[], []]
    async with httpx.AsyncClient(base_url=api_url, timeout=httpx.Timeout(600, connect=10)) as client:
        for turn in range(3):
            for c, history in enumerate(conversations):
                history.append({"role": "user", "content": questions[c * 3 + turn]})
                answer = await chat(client, list(history), args, first if turn == 0 else later)
                history.append({"role": "assistant", "content": answer or "I do not know."})
        metrics = (await client.get("/metrics")).text
    routed = [line for line in metrics.splitlines() if line.startswith("rag_llm_affinity_followups")]
    return {
        "followups": later.answered,
        "followup_prompt_reuse": round(later.cached / later.prompt, 3) if later.prompt else None,
        "first_turn_prompt_reuse": round(first.cached / first.prompt, 3) if first.prompt else None,
        "followup_ttft_ms": latency_summary(later.ttft_ms),
        "routing": routed,
    }


async def kill_one(api_url: str, servers: list[Any], args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    """--kill-users streaming; one server SIGKILLed once both stream tokens; its streams' errors timed, the rest tallied."""
    before, after = Tally(), Tally()
    killed_at: list[float] = []
    long_answers = argparse.Namespace(**{**vars(args), "max_tokens": max(args.max_tokens, 256)})

    def going_on() -> bool:
        return not killed_at or time.perf_counter() < killed_at[0] + args.kill_duration

    async with httpx.AsyncClient(base_url=api_url, timeout=httpx.Timeout(600, connect=10)) as client:

        async def one_user(u: int) -> None:
            i = 0
            while going_on():
                tally = after if killed_at else before
                question = questions[(u * 7 + i) % len(questions)]
                await chat(client, [{"role": "user", "content": question}], long_answers, tally)
                i += 1

        tasks = [asyncio.create_task(one_user(u)) for u in range(args.kill_users)]
        began = time.perf_counter()
        deadline = began + 300
        # Both servers generate (a stream still in its prefill would move to the other server unseen).
        while time.perf_counter() < deadline and not (before.streaming >= 2 and await _every_server_busy(client)):
            await asyncio.sleep(0.2)
        os.killpg(servers[0].pid, signal.SIGKILL)
        killed_at.append(time.perf_counter())
        await asyncio.gather(*tasks)
    errors_after = [round(t - killed_at[0], 3) for t in before.error_at + after.error_at if t >= killed_at[0]]
    return {
        "killed": servers[0].url,
        "streams_ended_with_error": len(errors_after),
        "error_after_kill_s": errors_after,
        "all_within_s": ERROR_WITHIN_S,
        "ok": bool(errors_after) and max(errors_after) <= ERROR_WITHIN_S and "HTTP 500" not in after.errors,
        "kill_after_s": round(killed_at[0] - began, 1),
        "before_kill": {"requests": before.requests, "answered": before.answered, "errors": before.errors},
        "after_kill": {
            "requests": after.requests,
            "answered": after.answered,
            "busy_429": after.busy,
            "errors": after.errors,
        },
    }


async def _every_server_busy(client: httpx.AsyncClient) -> bool:
    """Whether the API's pool runs a generation on each of its servers (its /health counts them)."""
    try:
        servers = (await client.get("/health")).json()["backends"]["llm"].get("servers", [])
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return bool(servers) and all(s["active"] > 0 for s in servers)


def _median(values: list[float]) -> float | None:
    return round(sorted(values)[len(values) // 2], 2) if values else None


def start_stack(workdir: Path, servers: int, llm_urls: list[str] | None) -> tuple[list[Any], list[Any], Any]:
    """(every process to stop, the llama-servers we started, the API)."""
    from tests.servers import start_api, start_embedding_server

    llamas = [start_generator(workdir) for _ in range(servers)] if llm_urls is None else []
    urls = llm_urls or [s.url for s in llamas]
    embedder = start_embedding_server(workdir, clean_env(workdir / "embedder"))
    env = clean_env(
        workdir / "api", RAG_LLM_URL=",".join(urls), RAG_EMBED_URL=embedder.url, RAG_LLM_PROMPT_STYLE="chat"
    )
    api = start_api(workdir, {**env, "RAG_POOL_PROBE_S": "0.5"})
    return [api, embedder, *llamas], llamas, api


async def configuration(args: argparse.Namespace, servers: int, workdir: Path) -> dict[str, Any]:
    llm_urls = args.llm_url.split(",")[:servers] if args.llm_url else None
    processes, llamas, api = start_stack(workdir, servers, llm_urls)
    result: dict[str, Any] = {"servers": servers, "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        paragraphs, questions = squad_article(args.article)
        result["seeded_documents"] = await seed(api.url, paragraphs[: args.seed_docs])
        questions = questions[: args.seed_docs * 5]
        async with httpx.AsyncClient(base_url=api.url, timeout=600) as client:  # a first answer warms up the stack
            await chat(client, [{"role": "user", "content": questions[-1]}], args, Tally())
        result["users"] = []
        for n in args.users:
            print(f"{servers} server(s), {n} user(s) ...", file=sys.stderr, flush=True)
            result["users"].append(await users(api.url, n, args, questions))
            print(f"  {json.dumps(result['users'][-1])}", file=sys.stderr, flush=True)
        if not args.skip_followups:
            result["followups"] = await followups(api.url, args, questions)
            print(f"  follow-ups: {json.dumps(result['followups'])}", file=sys.stderr, flush=True)
        if servers > 1 and not args.skip_kill and llamas:
            print(f"{servers} servers: one killed under load ...", file=sys.stderr, flush=True)
            result["kill"] = await kill_one(api.url, llamas, args, questions)
            print(f"  {json.dumps(result['kill'])}", file=sys.stderr, flush=True)
    finally:
        for process in processes:
            process.stop()
    result["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def summary(results: dict[str, Any]) -> str:
    lines = [
        f"{'servers':>7} {'users':>5} {'answered':>8} {'429':>6} {'TTFT p50':>9} {'p95':>7} "
        f"{'per-user tok/s':>14} {'aggregate tok/s':>15} {'reuse':>6} {'load':>5}"
    ]
    for config in results["configurations"]:
        for u in config["users"]:
            lines.append(
                f"{config['servers']:>7} {u['users']:>5} {u['answered']:>8} {u['share_429']:>6} "
                f"{u['ttft_ms'].get('p50', '-'):>9} {u['ttft_ms'].get('p95', '-'):>7} "
                f"{u['per_user_decode_tok_s_p50'] or '-':>14} {u['aggregate_tok_s']:>15} "
                f"{u['prompt_reuse'] if u['prompt_reuse'] is not None else '-':>6} {u['load_avg'][0]:>5}"
            )
    by_servers = {c["servers"]: {u["users"]: u for u in c["users"]} for c in results["configurations"]}
    for n in (4, 2):
        if 1 in by_servers and 2 in by_servers and n in by_servers[1] and n in by_servers[2]:
            one, two = by_servers[1][n]["aggregate_tok_s"], by_servers[2][n]["aggregate_tok_s"]
            lines.append(f"aggregate at {n} users, two servers / one: {two / one:.2f}x" if one else "")
    for config in results["configurations"]:
        if "followups" in config:
            f = config["followups"]
            lines.append(
                f"{config['servers']} server(s): follow-ups reuse {f['followup_prompt_reuse']} of their prompt"
            )
        if "kill" in config:
            k = config["kill"]
            lines.append(
                f"kill: {k['streams_ended_with_error']} streams ended with error after {k['error_after_kill_s']} s; "
                f"after it {k['after_kill']}; ok: {k['ok']}"
            )
    return "\n".join(line for line in lines if line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2], help="pool sizes to measure")
    parser.add_argument("--users", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=1, help="questions each user asks, one after another")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--kill-duration", type=float, default=45.0, help="seconds of load after the kill")
    parser.add_argument("--kill-users", type=int, default=2, help="users streaming while a server is killed")
    parser.add_argument("--skip-kill", action="store_true")
    parser.add_argument("--skip-followups", action="store_true")
    parser.add_argument("--llm-url", help="running llama-servers (comma-separated) instead of starting them")
    parser.add_argument("--article", type=int, default=0)
    parser.add_argument("--seed-docs", type=int, default=20)
    parser.add_argument("--json", type=Path, default=RESULTS / "concurrency.json")
    datasets.add_options(parser, "squad")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    results: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "cpus": os.cpu_count(),
        "configurations": [],
    }
    for servers in args.servers:
        with tempfile.TemporaryDirectory(prefix="rag-concurrency-") as tmp:
            results["configurations"].append(asyncio.run(configuration(args, servers, Path(tmp))))
    write_json(args.json, results, default=str)
    print(summary(results))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
