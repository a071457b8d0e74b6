"""Query latency of retrieval at 10k and 100k chunks: p50/p95 of each stage and of the whole search.

The store holds synthetic chunks: sentences of SQuAD (and, one chunk in ten, CMRC) paragraphs drawn at
random into ~120-word chunks, so that BM25's posting lists look like real text, with random unit vectors
(the HNSW search costs the same). Queries are real SQuAD and CMRC questions, embedded for real by the
embedding server (started here unless --embed-url is given). Stages, timed one query at a time:

    embed        EmbeddingClient.embed over HTTP (the bundled all-MiniLM-L6-v2)
    dense        ChunkStore.query, Chroma HNSW, depth candidates
    lexical      LexicalIndex.search, tantivy BM25, depth candidates
    search       Retriever.search(mode="hybrid", k) with the query vector at hand: both lists, fusion,
                 the document catalog (SQLite), texts of lexical-only hits
    embed+search Retriever.search through the embedding server, what a chat request pays

    .venv/bin/python -m bench.query_latency                       # 10k then 100k (~4 min to build)
    .venv/bin/python -m bench.query_latency --sizes 20000 --queries 100
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench._servers import server_env
from rag.answering.retrieval import Retriever
from rag.clients.embedding import EmbeddingClient
from rag.core.config import Settings
from rag.store.catalog import DocumentCatalog
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex

COLLECTION = "latency"
DIM = 384
CHUNKS_PER_DOC = 20


def load_text() -> tuple[list[str], list[str], list[str], list[str]]:
    """(English sentences, Chinese sentences, English questions, Chinese questions)."""
    out: list[list[str]] = [[], [], [], []]
    for i, (name, splitter) in enumerate((("squad", r"(?<=[.!?])\s+"), ("cmrc", r"(?<=[。！？])"))):
        raw = datasets.read(name)
        for article in raw["data"]:
            for paragraph in article["paragraphs"]:
                out[i] += [s for s in re.split(splitter, paragraph["context"]) if s.strip()]
                out[i + 2] += [qa["question"] for qa in paragraph["qas"]]
    return out[0], out[1], out[2], out[3]


def synthetic_chunks(n: int, english: list[str], chinese: list[str], rng: random.Random) -> list[str]:
    chunks = []
    for i in range(n):
        pool, target = (chinese, 250) if i % 10 == 9 else (english, 650)  # characters
        parts, size = [], 0
        while size < target:
            parts.append(rng.choice(pool))
            size += len(parts[-1])
        chunks.append(" ".join(parts))
    return chunks


def random_unit_vectors(n: int, rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def grow(
    store: ChunkStore,
    lexical: LexicalIndex,
    catalog: DocumentCatalog,
    start: int,
    texts: list[str],
    vectors: np.ndarray,
) -> None:
    """Add chunks numbered from `start`, CHUNKS_PER_DOC to a document, every document indexed in the catalog."""
    step = 2000
    for offset in range(0, len(texts), step):
        numbers = range(start + offset, start + min(offset + step, len(texts)))
        ids = [f"d{n // CHUNKS_PER_DOC:06d}:{n % CHUNKS_PER_DOC}" for n in numbers]
        metas = [{"doc_id": i.split(":")[0], "chunk_index": int(i.split(":")[1])} for i in ids]
        part = texts[offset : offset + step]
        store.upsert(COLLECTION, ids, vectors[offset : offset + step].tolist(), part, metas)
        lexical.add(COLLECTION, [(i, m["doc_id"], t) for i, m, t in zip(ids, metas, part)])
        for doc_id in sorted({m["doc_id"] for m in metas if m["chunk_index"] == 0}):
            catalog.claim(
                COLLECTION, doc_id, source=doc_id, name=doc_id, size=1, owner="bench", is_live=lambda _: False
            )
            catalog.mark_indexed(COLLECTION, doc_id, chunks=CHUNKS_PER_DOC, pages=None, owner="bench")


class VectorsAtHand:
    """Query vectors computed beforehand, through the Embedder protocol: `search` without the embed."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        return [self.vectors[t] for t in texts]


async def timed(queries: Iterable[str], call: Callable[[str], Awaitable[object]]) -> list[float]:
    out = []
    for q in queries:
        started = time.perf_counter()
        await call(q)
        out.append((time.perf_counter() - started) * 1000)
    return out


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


async def measure(
    size: int,
    queries: list[str],
    embedder: EmbeddingClient,
    store: ChunkStore,
    lexical: LexicalIndex,
    catalog: DocumentCatalog,
    settings: Settings,
    k: int,
) -> dict[str, dict[str, float]]:
    depth = settings.retrieval_depth
    vectors = dict(zip(queries, await embedder.embed(queries)))
    at_hand = Retriever(VectorsAtHand(vectors), store, lexical, catalog, settings)
    live = Retriever(embedder, store, lexical, catalog, settings)

    async def in_thread(fn, *args):
        return await asyncio.to_thread(fn, *args)

    stages: dict[str, Callable[[str], Awaitable[object]]] = {
        "embed": lambda q: embedder.embed([q]),
        "dense": lambda q: in_thread(store.query, COLLECTION, vectors[q], depth, None),
        "lexical": lambda q: in_thread(lexical.search, COLLECTION, q, depth, None),
        "search": lambda q: at_hand.search(q, collection=COLLECTION, k=k),
        "embed+search": lambda q: live.search(q, collection=COLLECTION, k=k),
    }
    for stage in stages.values():  # warm caches and connections
        await timed(queries[:5], stage)
    results = {}
    for name, stage in stages.items():
        ms = await timed(queries, stage)
        results[name] = {"p50": p(ms, 50), "p95": p(ms, 95), "mean": statistics.fmean(ms)}
        print(
            f"  {size:>7} chunks  {name:<13} p50 {results[name]['p50']:6.1f} ms   p95 {results[name]['p95']:6.1f} ms"
            f"   mean {results[name]['mean']:6.1f} ms",
            flush=True,
        )
    return results


def start_embedder(workdir: Path, threads: int | None):
    from tests.servers import start_embedding_server

    env = server_env(workdir / "embedder")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op threads
    return start_embedding_server(workdir, env)


async def run(args: argparse.Namespace, workdir: Path) -> dict:
    english, chinese, q_en, q_zh = load_text()
    rng = random.Random(7)
    queries = rng.sample(q_en, args.queries - args.queries // 5) + rng.sample(q_zh, args.queries // 5)
    rng.shuffle(queries)
    server = None if args.embed_url else start_embedder(workdir, args.embed_threads)
    settings = Settings(data_dir=workdir, embed_url=args.embed_url or server.url, retrieval_depth=args.depth)
    embedder = EmbeddingClient(settings.embed_url, model=settings.embed_model)
    store = ChunkStore.open(settings)
    lexical = LexicalIndex(workdir / "lexical.sqlite")
    catalog = DocumentCatalog(workdir / "catalog.sqlite")
    results: dict = {}
    try:
        have = 0
        vec_rng = np.random.default_rng(7)
        for size in sorted(args.sizes):
            started = time.perf_counter()
            texts = synthetic_chunks(size - have, english, chinese, rng)
            grow(store, lexical, catalog, have, texts, random_unit_vectors(len(texts), vec_rng))
            print(f"built {size} chunks (+{size - have} in {time.perf_counter() - started:.0f} s)", file=sys.stderr)
            have = size
            results[size] = await measure(size, queries, embedder, store, lexical, catalog, settings, args.k)
    finally:
        await embedder.aclose()
        lexical.close()
        catalog.close()
        if server:
            server.stop()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200, help="timed queries per stage (a fifth Chinese)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--depth", type=int, default=50, help="candidates per method (RAG_RETRIEVAL_DEPTH)")
    parser.add_argument("--embed-url", default=None, help="a running embedding server (default: start one)")
    parser.add_argument(
        "--embed-threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of the started embedding server (default: torch's own choice)",
    )
    parser.add_argument("--json", type=Path, default=None)
    datasets.add_options(parser, "squad", "cmrc")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    with tempfile.TemporaryDirectory(prefix="rag-latency-") as tmp:
        # numpy's BLAS threads spin after a matrix op and steal the embedder's cores: one thread here.
        with threadpool_limits(1, "blas"):
            results = asyncio.run(run(args, Path(tmp)))
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
