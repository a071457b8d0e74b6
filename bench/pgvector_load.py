"""Filling an empty pgvector collection, row by row through its HNSW index against a bulk load with the
index built once after (`PgVectorStore.loading`, what `rag store repair` does into an empty store), and
concurrent dense queries on it.

    nice -n 10 .venv/bin/python -m bench.pgvector_load                       # 20k chunks, 384-d
    nice -n 10 .venv/bin/python -m bench.pgvector_load --chunks 5000 --queries 50   # a quick look
    nice -n 10 .venv/bin/python -m bench.pgvector_load --chunks 100000 --ways bulk bulk_server_memory \
        --json bench/results/pgvector_load-100k.json      # what sizing maintenance_work_mem gives
    nice -n 10 .venv/bin/python -m bench.pgvector_load --database-url postgresql://...

The chunks are synthetic: unit vectors in clusters (a centre per 50 chunks plus Gaussian noise), in
documents of 10 chunks, written in batches of `rag store repair`'s size. Each way fills a new database
of the same PostgreSQL (the wheel's PostgreSQL 18.4 with pgvector 0.8.5, started here unless
--database-url names one), timed as a whole (a bulk load also split into its load and its index build;
`bulk_server_memory` builds with the server's maintenance_work_mem, not one sized to the graph; the
notices PostgreSQL sent meanwhile are kept). Recall: each query's top 10 from the store (HNSW, ef_search
200) against the exact top 10 by cosine. Then, on the bulk-built store, --parallel threads ask the
--queries dense queries between them (depth 50, ids and scores, as a hybrid search asks), through a
store of one reader connection (as before the pool) and through the store's pool of readers, in turns,
3 rounds each: the median wall time of all of them (and one thread's, for scale).

Results: bench/results/pgvector_load.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, write_json  # noqa: E402
from rag.store import pg_vectors  # noqa: E402
from rag.store.pg_vectors import PgVectorStore  # noqa: E402
from rag.store.repair import BATCH  # noqa: E402

RESULTS = ROOT / "bench" / "results"
COLLECTION = "bench"


def clustered(n: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors in clusters (as chunks of a few topics are), float32."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(n // 50, 1), dim))
    points = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.normal(size=(n, dim))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fill(store: PgVectorStore, vectors: np.ndarray, bulk: bool) -> dict[str, Any]:
    """Write every vector in repair-sized batches; seconds in all (and, for a bulk load, of the index)."""
    ids = [f"doc{i // 10}:{i % 10}" for i in range(len(vectors))]
    started = time.perf_counter()
    with store.loading(COLLECTION) if bulk else nullcontext():
        for start in range(0, len(ids), BATCH):
            part = ids[start : start + BATCH]
            metadatas = [{"doc_id": i.split(":")[0], "chunk_index": int(i.split(":")[1])} for i in part]
            store.upsert(COLLECTION, part, vectors[start : start + BATCH], [f"chunk {i}" for i in part], metadatas)
        loaded = time.perf_counter()
    done = time.perf_counter()
    out = {"seconds": round(done - started, 1), "load_avg_after": load_avg()}
    if bulk:
        out.update(load_s=round(loaded - started, 1), index_s=round(done - loaded, 1))
    return out


def recall(store: PgVectorStore, vectors: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """The store's top 10 against the exact top 10 by cosine: mean recall, queries with all ten."""
    ids = [f"doc{i // 10}:{i % 10}" for i in range(len(vectors))]
    found = [{h.id for h in store.query(COLLECTION, q.tolist(), 10, texts=False)} for q in queries]
    exact = [{ids[i] for i in np.argsort(-(vectors @ q), kind="stable")[:10]} for q in queries]
    hits = [len(f & e) / 10 for f, e in zip(found, exact, strict=True)]
    return {"recall_at_10": round(float(np.mean(hits)), 4), "all_ten": sum(h == 1.0 for h in hits)}


def parallel(store: PgVectorStore, queries: np.ndarray, threads: int) -> float:
    """Seconds for `threads` threads to ask every query between them."""
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda q: store.query(COLLECTION, q.tolist(), 50, texts=False), queries))
    return round(time.perf_counter() - started, 2)


@contextmanager
def notices() -> Iterator[list[str]]:
    """The PostgreSQL notices the store logs meanwhile (pgvector's, when a graph outgrows its memory)."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    pg_vectors.log.addHandler(handler)
    try:
        yield said
    finally:
        pg_vectors.log.removeHandler(handler)


@contextmanager
def build_memory(way: str) -> Iterator[None]:
    """For bulk_server_memory, an index build that keeps the server's maintenance_work_mem."""
    kept = pg_vectors.BUILD_MEMORY_MAX
    if way == "bulk_server_memory":
        pg_vectors.BUILD_MEMORY_MAX = 0
    try:
        yield
    finally:
        pg_vectors.BUILD_MEMORY_MAX = kept


@contextmanager
def databases(url: str | None, workdir: Path) -> Iterator[Callable[[], str]]:
    """A function that makes a new database and returns its URL, on `url`'s server or the wheel's."""
    import psycopg

    stop = None
    if url is None:
        from rag.deploy.replicas import embedded_postgres

        url, stop = embedded_postgres(workdir / "postgres")
    server = url
    count = iter(range(1000))

    def new() -> str:
        name = f"bench_load_{os.getpid()}_{next(count)}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return urlparse(server)._replace(path=f"/{name}").geturl()

    try:
        yield new
    finally:
        if stop is not None:
            stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--dimensions", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200, help="recall queries, and the parallel ones")
    parser.add_argument("--parallel", type=int, default=8, help="threads asking queries at once")
    parser.add_argument(
        "--ways",
        nargs="+",
        choices=["row_by_row", "bulk", "bulk_server_memory"],
        default=["row_by_row", "bulk"],
        help="bulk_server_memory: the bulk load with the server's maintenance_work_mem, not one sized to the graph",
    )
    parser.add_argument("--database-url", default=None, help="a PostgreSQL with pgvector (default: the wheel's)")
    parser.add_argument("--json", type=Path, default=RESULTS / "pgvector_load.json")
    args = parser.parse_args(argv)
    print(header(), flush=True)
    vectors = clustered(args.chunks, args.dimensions, seed=0)
    queries = clustered(args.queries, args.dimensions, seed=1)
    results: dict[str, Any] = {
        "chunks": args.chunks,
        "dimensions": args.dimensions,
        "batch": BATCH,
        "queries": args.queries,
        "load_avg_at_start": load_avg(),
        "ways": {},
    }
    with tempfile.TemporaryDirectory(prefix="rag-pgvector-load-") as tmp:
        Path(tmp).chmod(0o755)  # PostgreSQL runs as its own user when this runs as root
        with databases(args.database_url, Path(tmp)) as new:
            urls = {}
            for way in args.ways:
                store = PgVectorStore(urls.setdefault(way, new()))
                try:
                    with notices() as said, build_memory(way):
                        results["ways"][way] = fill(store, vectors, bulk=way != "row_by_row")
                    results["ways"][way].update(recall(store, vectors, queries), notices=said)
                    print(way, json.dumps(results["ways"][way]), flush=True)
                finally:
                    store.close()
            searched = urls.get("bulk") or urls[args.ways[0]]  # the store an API would search
            results["parallel"] = {"threads": args.parallel, **parallel_queries(searched, queries, args.parallel)}
            print("parallel", json.dumps(results["parallel"]), flush=True)
    write_json(args.json, results)
    print(f"wrote {args.json}", file=sys.stderr)


def parallel_queries(url: str, queries: np.ndarray, threads: int, rounds: int = 3) -> dict[str, Any]:
    """The wall time of every query asked by `threads` threads, through one reader connection (as before
    the pool) and through the store's pool, in turns (`rounds` each, the median), and by one thread."""
    pooled, one = PgVectorStore(url), PgVectorStore(url, readers=1)
    try:
        parallel(pooled, queries, threads)  # warm: the index's pages in shared buffers, the pool's connections
        times: dict[str, list[float]] = {"one_reader_s": [], "pool_s": []}
        for _ in range(rounds):
            times["one_reader_s"].append(parallel(one, queries, threads))
            times["pool_s"].append(parallel(pooled, queries, threads))
        return {
            **{key: float(np.median(values)) for key, values in times.items()},
            "rounds": times,
            "one_thread_s": parallel(pooled, queries, 1),
            "readers": pooled.readers,
            "load_avg_after": load_avg(),
        }
    finally:
        one.close()
        pooled.close()


if __name__ == "__main__":
    main()
