"""Stream fidelity: decode speed and time to first token through POST /v1/chat vs llama-server directly.

Both paths get the same final prompt in the same run, one after the other, the order alternating per
question. The prompt that the API sent is rebuilt here from its `sources` event (the texts, ids and
labels that were packed) in the prompt style the API reports in `done` (chat messages, or the completion
prompt of a base model, sent to /v1/completions with the same stop) with rag.answering.prompt, and
checked token for token against the API's `budget.used` by llama-server's own count, so the direct call
is the same request minus our stack. The upload of the documents must index every one of them first.

Both calls find the prompt in llama-server's cache (cache_n is printed): a warm-up call per question,
through the API with the same max_tokens, primes it with the exact prompt the API will send (the answer
reserve depends on max_tokens, so a shorter warm-up could pack other sources), and the measured API call
must pack the same sources. So the difference in time to first token is our own cost: the HTTP hop, packing (tokenize
calls), the generation gate and SSE framing. "added" = API TTFT - the API's retrieval time - direct
TTFT. Since llama-server's own speed swings on a shared CPU from one call to the next, the API's share
is also given on its own: API TTFT - retrieval - the API's upstream TTFT (request to llama-server until
its first token, timed inside the API) = packing, the gate, HTTP and SSE. Decode speed is measured at
the client, first token to last: (tokens - 1) / seconds, and as a share of llama-server's own figure.

    .venv/bin/python -m bench.stream_fidelity                       # starts llama-server and the embedder
    .venv/bin/python -m bench.stream_fidelity --questions 20 --max-tokens 128
    .venv/bin/python -m bench.stream_fidelity --llm-url http://127.0.0.1:8081 --embed-url http://127.0.0.1:8082
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench._servers import server_env, start_generator
from rag.answering.prompt import COMPLETION_STOP, ChatStyle, CompletionStyle
from rag.clients.llm import LlamaServerClient


@dataclass
class Run:
    path: str  # "api" or "direct"
    ttft_ms: float
    tokens: int
    decode_tps: float
    server_tps: float | None  # llama-server's own timings.predicted_per_second
    cache_n: int | None
    retrieval_ms: float = 0.0
    pack_ms: float = 0.0
    server_ttft_ms: float = 0.0  # the API's own: from the request's start in the answering core
    upstream_ttft_ms: float = 0.0  # the API's client of llama-server: request to first token
    decode_cpu_ms: float = 0.0  # CPU time the API process spent from the first token to the end


def cpu_ms(pid: int | None) -> float:
    """User + system CPU time of a process so far (Linux /proc; 10 ms resolution)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def squad_documents(
    n_articles: int,
    rng: random.Random,
    path: Path | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Some SQuAD articles (of the file at `path`, else the run's `--squad` set) as text files, and questions."""
    raw = json.loads(path.read_text(encoding="utf-8")) if path else datasets.read("squad")
    articles = rng.sample(raw["data"], n_articles)
    docs = {f"{a['title']}.txt": "\n\n".join(p["context"] for p in a["paragraphs"]) for a in articles}
    questions = [qa["question"] for a in articles for p in a["paragraphs"] for qa in p["qas"]]
    return docs, questions


def parse_sse_line(line: str, state: dict[str, Any]) -> tuple[str, Any] | None:
    """Feed one SSE line; returns (event, data) when an event is complete."""
    if line.startswith("event:"):
        state["event"] = line[6:].strip()
    elif line.startswith("data:"):
        state.setdefault("data", []).append(line[5:].lstrip())
    elif line == "" and state.get("data"):
        raw = "\n".join(state.pop("data"))
        event = state.pop("event", "message")
        return event, (raw if raw == "[DONE]" else json.loads(raw))
    return None


async def sse(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
    """POST and yield the (event, data) pairs of the SSE answer as they arrive."""
    state: dict[str, Any] = {}
    async with http.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            got = parse_sse_line(line, state)
            if got is not None:
                yield got


def rates(started: float, stamps: list[float]) -> tuple[float, float]:
    ttft = (stamps[0] - started) * 1000 if stamps else float("nan")
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return ttft, ((len(stamps) - 1) / span if span > 0 else float("nan"))


async def through_api(
    http: httpx.AsyncClient, api: str, question: str, max_tokens: int, api_pid: int | None = None
) -> tuple[Run, dict]:
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    stamps: list[float] = []
    events: dict[str, Any] = {}
    cpu_at_first = 0.0
    started = time.perf_counter()
    async for name, data in sse(http, f"{api}/v1/chat", body):
        if name == "token":
            stamps.append(time.perf_counter())
            if len(stamps) == 1:
                cpu_at_first = cpu_ms(api_pid)
        else:
            events[name] = data
    decode_cpu = cpu_ms(api_pid) - cpu_at_first
    if "done" not in events:
        raise RuntimeError(f"the API stream ended without done: {events.get('error')}")
    done = events["done"]
    ttft, tps = rates(started, stamps)
    run = Run(
        "api",
        ttft,
        len(stamps),
        tps,
        done["timings"].get("predicted_per_second"),
        done.get("cache_n"),
        done.get("retrieval_ms", 0.0),
        done.get("pack_ms", 0.0),
        done.get("ttft_ms") or 0.0,
        done.get("upstream_ttft_ms") or 0.0,
        decode_cpu,
    )
    return run, events


Prompt = list[dict[str, str]] | str  # chat messages, or a completion-style prompt


async def direct(http: httpx.AsyncClient, llm_url: str, prompt: Prompt, max_tokens: int) -> Run:
    """The request LlamaServerClient.stream_chat (or stream_completion) makes, sent straight to llama-server."""
    body: dict[str, Any] = {
        "model": "gemma",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": True,
    }
    if isinstance(prompt, str):
        body.update(prompt=prompt, stop=list(COMPLETION_STOP))
        path = "/v1/completions"
    else:
        body.update(messages=prompt)
        path = "/v1/chat/completions"
    stamps: list[float] = []
    final: dict[str, Any] = {}
    started = time.perf_counter()
    async for _, chunk in sse(http, f"{llm_url}{path}", body):
        if chunk == "[DONE]":
            continue
        choice = chunk["choices"][0] if chunk.get("choices") else {}
        text = choice.get("text") if isinstance(prompt, str) else (choice.get("delta") or {}).get("content")
        # The API drops the blank a completion starts with: its first token is the first non-blank one.
        if text and (stamps or not isinstance(prompt, str) or text.strip()):
            stamps.append(time.perf_counter())
        if "timings" in chunk:
            final = chunk["timings"]
    ttft, tps = rates(started, stamps)
    return Run("direct", ttft, len(stamps), tps, final.get("predicted_per_second"), final.get("cache_n"))


def prompt_of(question: str, events: dict[str, Any]) -> Prompt:
    """The prompt the API sent, in the style it used, rebuilt from its sources event."""
    style = CompletionStyle() if events["done"].get("style") == "completion" else ChatStyle()
    rendered = []
    for source in events["sources"]["sources"]:
        meta = {k: source[k] for k in ("source", "page", "heading") if k in source}
        rendered.append(style.render_source(source["id"], source["text"], meta))
    return style.build(rendered, [], question)


async def count_tokens(llm: LlamaServerClient, prompt: Prompt) -> int:
    """llama-server's own count, as the API's budget counts it."""
    if isinstance(prompt, str):
        return len(await llm.tokenize(prompt, add_special=True))
    return await llm.count_chat_tokens(prompt)


def source_ids(events: dict[str, Any]) -> list[str]:
    return [source["id"] for source in events["sources"]["sources"]]


async def measure(
    args: argparse.Namespace, api: str, llm_url: str, questions: list[str], api_pid: int | None
) -> list[tuple[Run, Run]]:
    pairs = []
    llm = LlamaServerClient(llm_url)
    async with httpx.AsyncClient(timeout=600) as http:
        for i, question in enumerate(questions):
            # Warm-up: the API call retrieves and packs, with the measured max_tokens (it sets the answer
            # reserve, so the packing); its prompt then sits in the slot's cache.
            _, events = await through_api(http, api, question, args.max_tokens)
            messages = prompt_of(question, events)
            counted = await count_tokens(llm, messages)
            if counted != events["budget"]["used"]:
                raise RuntimeError(f"rebuilt prompt has {counted} tokens, the API sent {events['budget']['used']}")
            if i % 2 == 0:
                api_run, api_events = await through_api(http, api, question, args.max_tokens, api_pid)
                direct_run = await direct(http, llm_url, messages, args.max_tokens)
            else:
                direct_run = await direct(http, llm_url, messages, args.max_tokens)
                api_run, api_events = await through_api(http, api, question, args.max_tokens, api_pid)
            if source_ids(api_events) != source_ids(events):
                raise RuntimeError(f"the API packed other sources than in the warm-up for {question!r}")
            pairs.append((api_run, direct_run))
            added = api_run.ttft_ms - api_run.retrieval_ms - direct_run.ttft_ms
            print(
                f"q{i + 1:<3} prompt {counted:5d} tok | api ttft {api_run.ttft_ms:7.1f} ms (retrieval "
                f"{api_run.retrieval_ms:5.1f}, pack {api_run.pack_ms:5.1f}, upstream {api_run.upstream_ttft_ms:5.1f}, "
                f"in-API {api_run.server_ttft_ms:6.1f}) {api_run.decode_tps:6.1f} tok/s "
                f"cache_n {api_run.cache_n} | direct ttft {direct_run.ttft_ms:7.1f} ms "
                f"{direct_run.decode_tps:6.1f} tok/s cache_n {direct_run.cache_n} | added {added:6.1f} ms "
                f"| tokens {api_run.tokens}/{direct_run.tokens}",
                flush=True,
            )
    await llm.aclose()
    return pairs


def summary(pairs: list[tuple[Run, Run]]) -> dict[str, float]:
    med = statistics.median
    api_tps = med(a.decode_tps for a, _ in pairs)
    direct_tps = med(d.decode_tps for _, d in pairs)
    added = [a.ttft_ms - a.retrieval_ms - d.ttft_ms for a, d in pairs]
    ratios = [a.decode_tps / d.decode_tps for a, d in pairs]
    return {
        "api_decode_tps_median": api_tps,
        "direct_decode_tps_median": direct_tps,
        "decode_ratio_median": med(ratios),
        "decode_ratio_of_medians": api_tps / direct_tps,
        "api_ttft_ms_median": med(a.ttft_ms for a, _ in pairs),
        "direct_ttft_ms_median": med(d.ttft_ms for _, d in pairs),
        "retrieval_ms_median": med(a.retrieval_ms for a, _ in pairs),
        "pack_ms_median": med(a.pack_ms for a, _ in pairs),
        "upstream_ttft_ms_median": med(a.upstream_ttft_ms for a, _ in pairs),
        "outside_core_ms_median": med(a.ttft_ms - a.server_ttft_ms for a, _ in pairs),
        # Our stack's own share, free of llama-server's speed in the moment: everything in the API's TTFT
        # that is neither retrieval nor the wait for llama-server's first token.
        "own_ms_median": med(a.ttft_ms - a.retrieval_ms - a.upstream_ttft_ms for a, _ in pairs),
        "own_ms_p90": sorted(a.ttft_ms - a.retrieval_ms - a.upstream_ttft_ms for a, _ in pairs)[
            int(0.9 * (len(pairs) - 1))
        ],
        "upstream_vs_direct_ttft_ms_median": med(a.upstream_ttft_ms - d.ttft_ms for a, d in pairs),
        # The API's CPU per streamed token: what relaying costs, and could take from llama-server on a shared CPU.
        "api_cpu_ms_per_token": sum(a.decode_cpu_ms for a, _ in pairs) / max(1, sum(a.tokens - 1 for a, _ in pairs)),
        "added_ttft_ms_median": med(added),
        "added_ttft_ms_max": max(added),
        # How much of llama-server's own decode speed reaches the client, per path: free of the server's
        # speed changing between the two calls (other work on a shared CPU).
        "delivery_api_median": med(a.decode_tps / a.server_tps for a, _ in pairs if a.server_tps),
        "delivery_direct_median": med(d.decode_tps / d.server_tps for _, d in pairs if d.server_tps),
        "server_tps_api_median": med(a.server_tps or 0 for a, _ in pairs),
        "server_tps_direct_median": med(d.server_tps or 0 for _, d in pairs),
    }


def check_upload(response: httpx.Response, expected: int) -> None:
    """Stop unless every document was indexed with chunks: the measurement needs sources to pack."""
    response.raise_for_status()
    results = response.json()["results"]
    bad = [r for r in results if r["status"] != "indexed" or not r["chunks"]]
    if len(results) != expected or bad:
        raise SystemExit(f"the upload did not index all {expected} documents: {bad or results}")


def start_backends(args: argparse.Namespace, workdir: Path) -> tuple[str, str, list[Any]]:
    from tests.servers import start_embedding_server

    started = []
    llm_url, embed_url = args.llm_url, args.embed_url
    if not llm_url:
        started.append(start_generator(workdir))
        llm_url = started[-1].url
    if not embed_url:
        started.append(start_embedding_server(workdir, server_env(workdir / "embedder")))
        embed_url = started[-1].url
    return llm_url, embed_url, started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--articles", type=int, default=3, help="SQuAD articles indexed as documents")
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--llm-url", default=None, help="a running llama-server (default: start one)")
    parser.add_argument("--embed-url", default=None, help="a running embedding server (default: start one)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=11)
    datasets.add_options(parser, "squad")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)

    from tests.servers import start_api

    rng = random.Random(args.seed)
    docs, questions = squad_documents(args.articles, rng)
    questions = rng.sample(questions, args.questions)
    with tempfile.TemporaryDirectory(prefix="rag-fidelity-") as tmp:
        workdir = Path(tmp)
        llm_url, embed_url, started = start_backends(args, workdir)
        env = server_env(workdir / "api", RAG_LLM_URL=llm_url, RAG_EMBED_URL=embed_url, RAG_TOP_K=str(args.top_k))
        api = start_api(workdir, env)
        started.append(api)
        try:
            files = [("files", (name, text.encode(), "text/plain")) for name, text in docs.items()]
            check_upload(httpx.post(f"{api.url}/v1/documents", files=files, timeout=600), len(docs))
            print(
                f"indexed {len(docs)} SQuAD articles; {len(questions)} questions, max_tokens {args.max_tokens}",
                file=sys.stderr,
            )
            pairs = asyncio.run(measure(args, api.url, llm_url, questions, api.pid))
        finally:
            for server in reversed(started):
                server.stop()
    result = summary(pairs)
    print()
    print(
        f"decode tok/s (client, median)   api {result['api_decode_tps_median']:.1f}   direct "
        f"{result['direct_decode_tps_median']:.1f}   ratio {result['decode_ratio_median']:.3f} "
        f"(target >= 0.98)"
    )
    print(
        f"decode tok/s (llama-server)     api {result['server_tps_api_median']:.1f}   direct "
        f"{result['server_tps_direct_median']:.1f}"
    )
    print(f"API CPU while relaying tokens   {result['api_cpu_ms_per_token']:.2f} ms per token")
    print(
        f"client / llama-server decode    api {result['delivery_api_median']:.3f}   direct "
        f"{result['delivery_direct_median']:.3f}   ratio "
        f"{result['delivery_api_median'] / result['delivery_direct_median']:.3f}"
    )
    print(
        f"TTFT ms (median)                api {result['api_ttft_ms_median']:.1f}   direct "
        f"{result['direct_ttft_ms_median']:.1f}   retrieval {result['retrieval_ms_median']:.1f}   pack "
        f"{result['pack_ms_median']:.1f}   upstream {result['upstream_ttft_ms_median']:.1f}   HTTP+routing "
        f"{result['outside_core_ms_median']:.1f}"
    )
    print(
        f"added TTFT beyond retrieval     median {result['added_ttft_ms_median']:.1f} ms   max "
        f"{result['added_ttft_ms_max']:.1f} ms (target <= 25)"
    )
    print(
        f"  of which our stack's own      median {result['own_ms_median']:.1f} ms   p90 {result['own_ms_p90']:.1f} ms "
        f"(pack, gate, HTTP, SSE); the API's upstream TTFT - direct TTFT: median "
        f"{result['upstream_vs_direct_ttft_ms_median']:.1f} ms"
    )
    if args.json:
        write_json(args.json, {"summary": result, "runs": [[asdict(a), asdict(d)] for a, d in pairs]})


if __name__ == "__main__":
    main()
