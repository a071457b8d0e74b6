"""Load: concurrent chat clients against the stack with a 1-slot llama-server, then concurrent uploads.

    .venv/bin/python -m bench.load                           # 10 then 50 clients, 60 s each; 50 uploads
    .venv/bin/python -m bench.load --clients 5 --duration 20 --uploads 20    # a quick look

The client is asyncio + httpx (one AsyncClient, a task per simulated user); no load-testing framework.
Everything runs for real as subprocesses on free ports: llama-server (the bundled Gemma 3 270M, the cpu
profile: one slot), the embedding server (bundled MiniLM) and the API (`rag serve-api`, default
backpressure: RAG_QUEUE_MAX waiting generations, RAG_QUEUE_TIMEOUT_S of wait, then 429).

Chat phase, for each client count N: N users each ask SQuAD questions about the indexed paragraphs in
a loop (POST /v1/chat, SSE), for --duration seconds. A 429 makes that user wait Retry-After (at most
5 s) and ask again. Counted: answered (a `done` event), 429, errors (any other status, an `error`
event, a transport failure); TTFT (request sent -> first `token` event, as the user sees it) and the
queue wait the API reports (`done.queue_ms`); the API's RSS before and after. When the time is up the
users hang up mid-stream, and llama-server's GET /slots must show no slot processing within
--idle-within seconds: a client that goes away must not keep the one slot generating.

Upload phase: --uploads concurrent POST /v1/documents of one file each, mixed: text, Markdown, HTML,
PDF and DOCX files, some uploaded twice under other names (same bytes), and invalid ones (empty,
whitespace, an executable, an image, an encrypted PDF). Then: every valid content is one document,
`indexed`, and after the API stops, the store holds exactly that document's chunks once (Chroma and
the lexical index), and nothing else.

Results: printed, and bench/results/load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
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
from bench.scale import clean_env, rss_mb  # noqa: E402
from rag.eval.harness import latency_summary  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CHAT_COLLECTION = "loadchat"
UPLOAD_COLLECTION = "loadupload"
RSS_GROWTH_BOUND_MB = 150


# ---------------------------------------------------------------- chat


@dataclass
class ChatTally:
    answered: int = 0
    busy: int = 0
    errors: int = 0
    hung_up: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    ttft_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)  # llama-server's, per answer

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


async def ask(client: httpx.AsyncClient, question: str, max_tokens: int, tally: ChatTally) -> float:
    """One chat request, streamed; returns how long to wait before the next (Retry-After on 429)."""
    body = {
        "messages": [{"role": "user", "content": question}],
        "collection": CHAT_COLLECTION,
        "max_tokens": max_tokens,
        "stream": True,
    }
    started = time.perf_counter()
    first_token = None
    event = None
    try:
        async with client.stream("POST", "/v1/chat", json=body) as response:
            if response.status_code == 429:
                tally.busy += 1
                return min(5.0, float(response.headers.get("retry-after", "1")))
            if response.status_code != 200:
                tally.error(f"HTTP {response.status_code}")
                return 1.0
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                    if event == "token" and first_token is None:
                        first_token = time.perf_counter()
                elif line.startswith("data:") and event == "done":
                    done = json.loads(line[5:])
                    tally.answered += 1
                    tally.total_ms.append((time.perf_counter() - started) * 1000)
                    if first_token is not None:
                        tally.ttft_ms.append((first_token - started) * 1000)
                    if done.get("queue_ms") is not None:
                        tally.queue_ms.append(done["queue_ms"])
                    tally.timings.append(done.get("timings") or {})
                    return 0.0
                elif line.startswith("data:") and event == "error":
                    tally.error(json.loads(line[5:]).get("code", "error_event"))
                    return 1.0
        tally.error("stream ended without done")
    except httpx.HTTPError as exc:
        tally.error(exc.__class__.__name__)
    return 1.0


async def user(client: httpx.AsyncClient, questions: list[str], max_tokens: int, tally: ChatTally, seed: int) -> None:
    rng = random.Random(seed)
    while True:
        try:
            pause = await ask(client, rng.choice(questions), max_tokens, tally)
        except asyncio.CancelledError:
            tally.hung_up += 1
            raise
        await asyncio.sleep(pause)


async def slots_busy(llm_url: str) -> int:
    async with httpx.AsyncClient(timeout=10) as client:
        slots = (await client.get(f"{llm_url}/slots")).json()
    return sum(bool(s.get("is_processing")) for s in slots)


def _median_timings(timings: list[dict[str, float]]) -> dict[str, float]:
    """Median prompt size and speeds that llama-server reported: what one answer costs the slot."""
    out = {}
    for key in ("prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second", "cache_n"):
        values = sorted(t[key] for t in timings if isinstance(t.get(key), (int, float)))
        if values:
            out[key] = round(values[len(values) // 2], 1)
    return out


async def chat_phase(
    api_url: str,
    llm_url: str,
    api_pid: int,
    clients: int,
    duration: float,
    questions: list[str],
    max_tokens: int,
    idle_within: float,
) -> dict[str, Any]:
    tally = ChatTally()
    rss_before = rss_mb(api_pid)
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    async with httpx.AsyncClient(base_url=api_url, timeout=httpx.Timeout(120, connect=10), limits=limits) as client:
        tasks = [asyncio.create_task(user(client, questions, max_tokens, tally, i)) for i in range(clients)]
        await asyncio.sleep(duration)
        busy_at_stop = await slots_busy(llm_url)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    stopped = time.perf_counter()
    busy = busy_at_stop
    while busy and time.perf_counter() - stopped < idle_within:
        await asyncio.sleep(0.25)
        busy = await slots_busy(llm_url)
    rss_after = rss_mb(api_pid)
    return {
        "clients": clients,
        "duration_s": duration,
        "max_tokens": max_tokens,
        "answered": tally.answered,
        "busy_429": tally.busy,
        "errors": tally.errors,
        "error_kinds": tally.error_kinds,
        "hung_up_mid_request": tally.hung_up,
        "answered_per_min": round(tally.answered * 60 / duration, 1),
        "ttft_ms": latency_summary(tally.ttft_ms),
        "queue_ms": latency_summary(tally.queue_ms),
        "answer_ms": latency_summary(tally.total_ms),
        "llama_server_median": _median_timings(tally.timings),
        "slots_busy_at_stop": busy_at_stop,
        "slots_busy_after": busy,
        "slot_idle_after_s": round(time.perf_counter() - stopped, 2),
        "api_rss_mb": {"before": rss_before["rss"], "after": rss_after["rss"], "peak": rss_after["peak"]},
    }


# ---------------------------------------------------------------- uploads


def upload_set(paragraphs: list[str], n: int, rng: random.Random) -> list[tuple[str, bytes, bool]]:
    """n (filename, bytes, valid) uploads in random order: about 12% repeats of valid files under
    another name, up to 5 invalid files, the rest distinct valid files of five kinds."""
    from tests import hostile

    invalid = [
        ("empty.txt", b"", False),
        ("blank.md", b" \n\t\n ", False),
        ("tool.bin", hostile.elf_executable(), False),
        ("picture.png", hostile.png_image(), False),
        ("locked.pdf", hostile.encrypted_pdf(), False),
    ]
    n_invalid = min(len(invalid), max(1, round(n * 0.1)))
    n_repeat = max(1, round(n * 0.12))
    kinds = ["txt", "md", "html", "pdf", "docx"]
    texts = rng.sample(paragraphs, n - n_invalid - n_repeat)
    files = [
        (f"doc-{i:03d}.{kinds[i % len(kinds)]}", _as_file(kinds[i % len(kinds)], t), True) for i, t in enumerate(texts)
    ]
    files += [(f"copy-of-{name}", data, True) for name, data, _ in rng.sample(files, n_repeat)]
    files += invalid[:n_invalid]
    rng.shuffle(files)
    return files


def _as_file(kind: str, text: str) -> bytes:
    from tests import hostile

    if kind == "md":
        return f"# Notes\n\n{text}\n".encode()
    if kind == "html":
        return f"<html><head><title>Page</title></head><body><h1>Page</h1><p>{text}</p></body></html>".encode()
    if kind == "pdf":
        latin = text.encode("latin-1", "replace").decode("latin-1")
        return hostile.text_pdf([[latin[i : i + 90] for i in range(0, len(latin), 90)]])
    if kind == "docx":
        return hostile.docx_document([("heading1", "Notes"), ("p", text)])
    return text.encode()


async def upload_phase(api_url: str, api_pid: int, files: list[tuple[str, bytes, bool]]) -> dict[str, Any]:
    rss_before = rss_mb(api_pid)

    async def one(client: httpx.AsyncClient, name: str, data: bytes) -> tuple[int, dict[str, Any]]:
        r = await client.post("/v1/documents", params={"collection": UPLOAD_COLLECTION}, files={"files": (name, data)})
        return r.status_code, r.json()

    started = time.perf_counter()
    limits = httpx.Limits(max_connections=len(files) + 5)
    async with httpx.AsyncClient(base_url=api_url, timeout=600, limits=limits) as client:
        answers = await asyncio.gather(*(one(client, name, data) for name, data, _ in files))
        listing = (await client.get("/v1/documents", params={"collection": UPLOAD_COLLECTION, "limit": 1000})).json()
    seconds = time.perf_counter() - started
    statuses: dict[str, int] = {}
    for (_name, _, valid), (code, body) in zip(files, answers):
        status = body["results"][0]["status"] if code == 200 else f"HTTP {code}"
        key = f"{'valid' if valid else 'invalid'}: {status}"
        statuses[key] = statuses.get(key, 0) + 1
    valid_ids = {hashlib.sha256(data).hexdigest() for _, data, valid in files if valid}
    rows = listing["documents"]
    indexed = [d for d in rows if d["state"] == "indexed"]
    per_id: dict[str, int] = {}
    for d in indexed:
        per_id[d["id"]] = per_id.get(d["id"], 0) + 1
    return {
        "uploads": len(files),
        "valid_uploads": sum(v for *_, v in files),
        "distinct_valid": len(valid_ids),
        "seconds": round(seconds, 1),
        "outcomes": statuses,
        "indexed_documents": len(indexed),
        "valid_indexed_once": sum(per_id.get(i) == 1 for i in valid_ids),
        "valid_missing": sorted(i[:12] for i in valid_ids if i not in per_id),
        "indexed_but_not_valid": sorted(d["id"][:12] for d in indexed if d["id"] not in valid_ids),
        "catalog_chunks": {d["id"]: d["chunks"] for d in indexed},
        "api_rss_mb": {"before": rss_before["rss"], "after": rss_mb(api_pid)["rss"]},
    }


def check_store(data_dir: Path, catalog_chunks: dict[str, int]) -> dict[str, Any]:
    """After the API stopped: each indexed document's chunks are in Chroma and the lexical index exactly once, nothing else."""
    from rag.core.config import Settings
    from rag.store.chroma_vectors import ChunkStore, StoreLock
    from rag.store.chunk_record import LexicalIndex

    settings = Settings(data_dir=data_dir)
    lock = StoreLock(data_dir)
    lock.acquire("bench.load")
    try:
        store = ChunkStore.open(settings)
        lexical = LexicalIndex(data_dir / "lexical.sqlite")
        wrong = {
            d: (n, store.count_document(UPLOAD_COLLECTION, d), lexical.count_document(UPLOAD_COLLECTION, d))
            for d, n in catalog_chunks.items()
        }
        wrong = {d[:12]: v for d, v in wrong.items() if not v[0] == v[1] == v[2]}
        totals = {
            "catalog": sum(catalog_chunks.values()),
            "chroma": store.count(UPLOAD_COLLECTION),
            "lexical": lexical.count(UPLOAD_COLLECTION),
        }
        lexical.close()
    finally:
        lock.release()
    return {
        "chunk_totals": totals,
        "documents_with_wrong_counts": wrong,
        "exactly_once": not wrong and len(set(totals.values())) == 1,
    }


# ---------------------------------------------------------------- the stack


def start_stack(workdir: Path) -> tuple[list[Any], Any]:
    from tests.servers import start_api, start_embedding_server

    llama = start_generator(workdir)
    embedder = start_embedding_server(workdir, clean_env(workdir / "embedder"))
    api = start_api(workdir, clean_env(workdir / "api", RAG_LLM_URL=llama.url, RAG_EMBED_URL=embedder.url))
    return [api, embedder, llama], api


async def seed(api_url: str, paragraphs: list[str]) -> int:
    files = [("files", (f"squad-{i:03d}.txt", p.encode())) for i, p in enumerate(paragraphs)]
    async with httpx.AsyncClient(base_url=api_url, timeout=600) as client:
        r = await client.post("/v1/documents", params={"collection": CHAT_COLLECTION}, files=files)
        r.raise_for_status()
    return sum(x["status"] == "indexed" for x in r.json()["results"])


def squad_article(index: int) -> tuple[list[str], list[str]]:
    raw = datasets.read("squad")
    article = raw["data"][index]
    return [p["context"] for p in article["paragraphs"]], [
        qa["question"] for p in article["paragraphs"] for qa in p["qas"]
    ]


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    servers, api = start_stack(workdir)
    llm_url = servers[2].url
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "stack": {"llama_slots": 1, "queue_max": 8, "queue_timeout_s": 30.0, "note": "API defaults"},
    }
    try:
        paragraphs, questions = squad_article(args.article)
        results["seeded_documents"] = await seed(api.url, paragraphs[: args.seed_docs])
        questions = questions[: args.seed_docs * 5]
        results["chat"] = []
        for n in args.clients:
            print(f"chat: {n} clients for {args.duration:g} s ...", file=sys.stderr, flush=True)
            phase = await chat_phase(
                api.url, llm_url, api.pid, n, args.duration, questions, args.max_tokens, args.idle_within
            )
            results["chat"].append(phase)
            print(
                f"  {json.dumps({k: phase[k] for k in ('answered', 'busy_429', 'errors', 'slots_busy_after')})}",
                file=sys.stderr,
                flush=True,
            )
        print(f"uploads: {args.uploads} at once ...", file=sys.stderr, flush=True)
        all_paragraphs = [
            p
            for a in datasets.read("squad")["data"][args.article + 1 :]
            for p in (q["context"] for q in a["paragraphs"])
        ]
        files = upload_set(all_paragraphs, args.uploads, random.Random(5))
        results["uploads"] = await upload_phase(api.url, api.pid, files)
    finally:
        for server in servers:
            server.stop()
    results["uploads"]["store"] = check_store(workdir / "api", results["uploads"].pop("catalog_chunks"))
    results["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def summary(results: dict[str, Any]) -> str:
    lines = [
        f"{'clients':>7} {'answered':>8} {'429':>5} {'errors':>6} {'TTFT p50':>9} {'p95':>7} {'queue p50':>9} "
        f"{'p95':>7} {'RSS before->after MiB':>22} {'slots busy after stop':>22}"
    ]
    for c in results["chat"]:
        growth = c["api_rss_mb"]["after"] - c["api_rss_mb"]["before"]
        lines.append(
            f"{c['clients']:>7} {c['answered']:>8} {c['busy_429']:>5} {c['errors']:>6} "
            f"{c['ttft_ms'].get('p50', '-'):>9} {c['ttft_ms'].get('p95', '-'):>7} {c['queue_ms'].get('p50', '-'):>9} "
            f"{c['queue_ms'].get('p95', '-'):>7} {c['api_rss_mb']['before']:>10}->{c['api_rss_mb']['after']:<8}"
            f"{'ok' if growth <= RSS_GROWTH_BOUND_MB else 'OVER'} "
            f"{c['slots_busy_after']:>8} (in {c['slot_idle_after_s']} s)"
        )
    u = results["uploads"]
    lines.append(
        f"uploads: {u['uploads']} at once in {u['seconds']} s; outcomes {u['outcomes']}; "
        f"{u['valid_indexed_once']} of {u['distinct_valid']} distinct valid files indexed exactly once; "
        f"store chunks {u['store']['chunk_totals']}, exactly once: {u['store']['exactly_once']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per client count")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--idle-within", type=float, default=15.0, help="seconds for the slot to go idle after")
    parser.add_argument("--uploads", type=int, default=50)
    parser.add_argument("--article", type=int, default=0, help="SQuAD article whose paragraphs the chat asks about")
    parser.add_argument("--seed-docs", type=int, default=20)
    parser.add_argument("--json", type=Path, default=RESULTS / "load.json")
    datasets.add_options(parser, "squad")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    with tempfile.TemporaryDirectory(prefix="rag-load-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    write_json(args.json, results)
    print(summary(results))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
