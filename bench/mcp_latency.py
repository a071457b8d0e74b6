"""What the MCP layer adds to a search: the `search` tool over Streamable HTTP (the SDK's client, at the
API's /mcp) against the retrieval time /v1/chat reports for the same question (`done.retrieval_ms`).

The API runs as its own process with the real embedding server and llama-server; SQuAD articles are
indexed through /v1/documents. For each question, in random order of the two: one /v1/chat (stream false,
max_tokens 1) whose `retrieval_ms` is the answering core's retrieval, and one MCP `search` timed at the
client, from the call to the parsed result (JSON-RPC, HTTP, SSE and the tool's payload included). The
added time is the MCP round trip minus the chat retrieval, per question and at p50/p95 (target: <= 10 ms).

    .venv/bin/python -m bench.mcp_latency [--squad PATH --questions 100 --json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench._servers import server_env
from bench.stream_fidelity import check_upload, squad_documents, start_backends

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "mcp_latency.json"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def chat_retrieval_ms(http: httpx.AsyncClient, api: str, question: str, top_k: int) -> float:
    body = {
        "messages": [{"role": "user", "content": question}],
        "stream": False,
        "max_tokens": 1,
        "temperature": 0,
        "top_k": top_k,
    }
    response = await http.post(f"{api}/v1/chat", json=body)
    response.raise_for_status()
    return float(response.json()["done"]["retrieval_ms"])


async def mcp_search_ms(client: Client, question: str, top_k: int) -> float:
    started = time.perf_counter()
    result = await client.call_tool("search", {"query": question, "top_k": top_k})
    elapsed = (time.perf_counter() - started) * 1000
    if result.is_error or not result.structured_content["results"]:
        raise SystemExit(f"search failed or found nothing for {question!r}: {result}")
    return elapsed


async def measure(api: str, questions: list[str], top_k: int, rng: random.Random) -> list[dict[str, Any]]:
    runs = []
    async with (
        httpx.AsyncClient(timeout=300) as http,
        httpx2.AsyncClient(timeout=300) as http2,
        Client(streamable_http_client(f"{api}/mcp", http_client=http2)) as client,
    ):
        for question in questions[:5]:  # warm-up: the first searches load indexes and caches
            await chat_retrieval_ms(http, api, question, top_k)
            await mcp_search_ms(client, question, top_k)
        for question in questions:
            if rng.random() < 0.5:
                chat = await chat_retrieval_ms(http, api, question, top_k)
                mcp = await mcp_search_ms(client, question, top_k)
            else:
                mcp = await mcp_search_ms(client, question, top_k)
                chat = await chat_retrieval_ms(http, api, question, top_k)
            runs.append({"question": question, "chat_retrieval_ms": chat, "mcp_search_ms": round(mcp, 2)})
    return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    chat = [r["chat_retrieval_ms"] for r in runs]
    mcp = [r["mcp_search_ms"] for r in runs]
    added = [m - c for m, c in zip(mcp, chat)]
    out = {}
    for name, values in (("chat_retrieval_ms", chat), ("mcp_search_ms", mcp), ("added_ms", added)):
        out[f"{name}_p50"] = round(statistics.median(values), 2)
        out[f"{name}_p95"] = round(percentile(values, 95), 2)
    out["added_p95_of_p95s_ms"] = round(out["mcp_search_ms_p95"] - out["chat_retrieval_ms_p95"], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    datasets.add_options(parser, "squad")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--articles", type=int, default=5, help="SQuAD articles indexed as documents")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--llm-url", default=None, help="a running llama-server (default: start one)")
    parser.add_argument("--embed-url", default=None, help="a running embedding server (default: start one)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    from tests.servers import start_api

    rng = random.Random(args.seed)
    docs, questions = squad_documents(args.articles, rng)
    questions = rng.sample(questions, min(args.questions, len(questions)))
    load_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="rag-mcp-latency-") as tmp:
        workdir = Path(tmp)
        llm_url, embed_url, started = start_backends(args, workdir)
        api = start_api(workdir, server_env(workdir / "api", RAG_LLM_URL=llm_url, RAG_EMBED_URL=embed_url))
        started.append(api)
        try:
            files = [("files", (name, text.encode(), "text/plain")) for name, text in docs.items()]
            check_upload(httpx.post(f"{api.url}/v1/documents", files=files, timeout=600), len(docs))
            print(
                f"indexed {len(docs)} SQuAD articles; {len(questions)} questions, top_k {args.top_k}", file=sys.stderr
            )
            runs = asyncio.run(measure(api.url, questions, args.top_k, rng))
        finally:
            for server in reversed(started):
                server.stop()
    result = summary(runs)
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start {load_start}, at end {load_end} (2 cores)")
    print(
        f"/v1/chat retrieval_ms      p50 {result['chat_retrieval_ms_p50']:.1f}   p95 {result['chat_retrieval_ms_p95']:.1f}"
    )
    print(f"MCP search (client)        p50 {result['mcp_search_ms_p50']:.1f}   p95 {result['mcp_search_ms_p95']:.1f}")
    print(
        f"added per question         p50 {result['added_ms_p50']:.1f}   p95 {result['added_ms_p95']:.1f}   "
        f"p95 - p95 {result['added_p95_of_p95s_ms']:.1f} ms (target <= 10)"
    )
    write_json(
        args.json,
        {
            "summary": result,
            "load_avg": {"start": load_start, "end": load_end},
            "articles": args.articles,
            "top_k": args.top_k,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
