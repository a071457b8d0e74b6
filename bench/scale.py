"""Scale: collections of 10k, 30k and 100k chunks: build time, write throughput as they grow, disk size,
query latency (embed + hybrid search, and search alone) and the API's memory.

    .venv/bin/python -m bench.scale                                   # 10k, 30k, 100k (~20-40 min here)
    .venv/bin/python -m bench.scale --sizes 2000 5000 --real 300 --queries 50   # a quick look
    .venv/bin/python -m bench.scale --workdir /var/tmp/scale --keep           # keep the stores, then
    .venv/bin/python -m bench.scale --workdir /var/tmp/scale --keep --reuse   # measure them again

What is real and what is derived (embedding 100k chunks with the bundled MiniLM on this 2-core CPU
would take well over an hour):
1. Real: SQuAD v1.1 dev paragraphs go through the ingestion pipeline (loader, chunker, the embedding
   server over HTTP, Chroma, the BM25 (tantivy) index, the catalog) until --real chunks are stored. Their rate
   (chunks/s, tokens/s) is the measured cost of embedding; the stored texts and vectors are read back.
2. Derived: chunk j > --real is a copy of real chunk j mod --real: the same text (so BM25's posting
   lists grow as with more documents of that vocabulary; identical texts tie), and that chunk's real
   vector plus Gaussian noise, renormalized, at a cosine of about --cosine to it (so HNSW sees clusters
   of near-duplicates around real points, not uniform random vectors). Derived chunks are written in
   documents of 10 through the pipeline's own write path (`DocumentStores.write_chunks`, batches of
   RAG_EMBED_BATCH) and the catalog's claim/mark_indexed, without the embedder.
   Build time = measured write time + (chunks / the measured real embedding rate), reported apart.
3. Each size is built in a store of its own, in a child process (Chroma allows one process per store
   path). Then, in that child: query latency of `Retriever.search` over real SQuAD questions, one at a
   time, k = RAG_TOP_K: "embed+hybrid" through the embedding server, "hybrid", "dense" and "lexical"
   with the query vector at hand. Then the real API (`rag serve-api`) is started on that store with a
   1-slot llama-server and asked --chat-queries chat questions (top_k 1, max_tokens 1: the retrieval
   and the resident memory are what count); its RSS is read from /proc after start and after them.

Results: bench/results/scale.json and bench/results/scale-latency.png (latency and write rate vs size).
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin after a matrix op and would steal the embedder's cores: one thread in this
# process (and its children), but the servers it starts get the environment as the user has it.
_SET_HERE = [v for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS") if v not in os.environ]
os.environ.update(dict.fromkeys(_SET_HERE, "1"))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header, write_json  # noqa: E402
from bench._servers import server_env, start_generator  # noqa: E402
from rag.core.config import Settings  # noqa: E402
from rag.eval.harness import latency_summary  # noqa: E402

RESULTS = ROOT / "bench" / "results"
COLLECTION = "scale"
CHUNKS_PER_DOC = 10
WINDOW = 2000  # chunks per write-rate sample


# ---------------------------------------------------------------- helpers


def rss_mb(pid: int) -> dict[str, float]:
    """Resident and peak resident memory of a process, MiB, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"rss": fields.get("VmRSS", 0.0), "peak": fields.get("VmHWM", 0.0)}


def disk_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def squad_text() -> tuple[list[str], list[str]]:
    """(paragraphs, questions) of SQuAD v1.1 dev."""
    raw = datasets.read("squad")
    paragraphs = [p["context"] for a in raw["data"] for p in a["paragraphs"]]
    questions = [qa["question"] for a in raw["data"] for p in a["paragraphs"] for qa in p["qas"]]
    return paragraphs, questions


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    # The BLAS thread limits set above are this process's own, not the servers'.
    return server_env(data_dir, leave_out=_SET_HERE, **extra)


class Parts:
    """A store opened the way the API opens it (locked, Chroma + the BM25 index + catalog + pipeline)."""

    def __init__(self, settings: Settings) -> None:
        from ingest.pipeline import IngestPipeline
        from rag.clients.embedding import EmbeddingClient
        from rag.store.catalog import DocumentCatalog, OwnerLease
        from rag.store.chroma_vectors import ChunkStore, StoreLock
        from rag.store.chunk_record import LexicalIndex

        self.settings = settings
        self.lock = StoreLock(settings.data_dir)
        self.lock.acquire("bench.scale")
        self.store = ChunkStore.open(settings)
        self.lexical = LexicalIndex(settings.data_dir / "lexical.sqlite")
        self.catalog = DocumentCatalog(settings.data_dir / "catalog.sqlite")
        self.lease = OwnerLease(settings.data_dir / "owners")
        self.embedder = EmbeddingClient(settings.embed_url, model=settings.embed_model)
        self.pipeline = IngestPipeline(settings, self.embedder, self.store, self.lexical, self.catalog, self.lease)

    async def aclose(self) -> None:
        await self.embedder.aclose()
        self.lexical.close()
        self.catalog.close()
        self.lease.release()
        self.lock.release()


# ---------------------------------------------------------------- 1. the real subset (child process)


async def _embed_real(settings: Settings, paragraphs: list[str], target: int, out: Path) -> dict[str, Any]:
    from ingest.pipeline import SourceFile

    parts = Parts(settings)
    files = []
    folder = settings.data_dir / "paragraphs"
    folder.mkdir(parents=True, exist_ok=True)
    # ~1.1 chunks per SQuAD paragraph with 200-token chunks: take enough paragraphs for `target` chunks.
    for i, text in enumerate(paragraphs[: max(1, int(target / 1.1) + 10)]):
        path = folder / f"squad-{i:05d}.txt"
        path.write_text(text, encoding="utf-8")
        files.append(SourceFile(path, path.name, path.name))
    try:
        await parts.embedder.embed(["warm up"])
        started = time.perf_counter()
        results = await parts.pipeline.run(files, COLLECTION)
        seconds = time.perf_counter() - started
        got = parts.store.collection(COLLECTION).get(include=["embeddings", "documents", "metadatas"])
    finally:
        await parts.aclose()
    tokens = [int(m.get("tokens", 0)) for m in got["metadatas"]]
    order = np.argsort(got["ids"])[:target]
    np.savez(
        out,
        vectors=np.asarray(got["embeddings"], dtype=np.float32)[order],
        texts=np.array(got["documents"], dtype=object)[order],
        tokens=np.asarray(tokens)[order],
    )
    n = len(got["ids"])
    return {
        "paragraphs": len(files),
        "chunks": n,
        "failed": sum(r.status == "failed" for r in results),
        "seconds": round(seconds, 1),
        "chunks_per_s": round(n / seconds, 2),
        "tokens_per_s": round(sum(tokens) / seconds, 1),
        "mean_tokens": round(sum(tokens) / max(n, 1), 1),
        "kept": int(len(order)),
    }


# ---------------------------------------------------------------- 2. one size: build and measure (child)


def derived_vectors(base: np.ndarray, n: int, cosine: float, rng: np.random.Generator) -> np.ndarray:
    """n unit vectors: base[j % len(base)] plus noise at about `cosine` to it."""
    picked = base[np.arange(n) % len(base)]
    dim = base.shape[1]
    sigma = np.sqrt((1 / cosine**2 - 1) / dim)  # |noise|^2 ~ sigma^2 * dim; cos ~ 1 / sqrt(1 + that)
    out = picked + rng.normal(0.0, sigma, size=picked.shape).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _records(start: int, texts: list[str], tokens: list[int]) -> list[Any]:
    from ingest.pipeline import ChunkRecord

    records = []
    for offset, (text, n_tokens) in enumerate(zip(texts, tokens)):
        number = start + offset
        doc_id, index = f"synthetic-{number // CHUNKS_PER_DOC:06d}", number % CHUNKS_PER_DOC
        meta = {
            "doc_id": doc_id,
            "chunk_index": index,
            "source": f"{doc_id}.txt",
            "start": 0,
            "end": len(text),
            "tokens": int(n_tokens),
        }
        records.append(ChunkRecord(f"{doc_id}:{index}", text, meta))
    return records


def _catalog_indexed(parts: Parts, records: list[Any]) -> None:
    """The catalog rows of the documents whose last chunk is in `records`, as the pipeline writes them."""
    for record in records:
        if record.metadata["chunk_index"] != CHUNKS_PER_DOC - 1:
            continue
        doc_id = str(record.metadata["doc_id"])
        parts.catalog.claim(
            COLLECTION,
            doc_id,
            source=f"{doc_id}.txt",
            name=f"{doc_id}.txt",
            size=1,
            owner=parts.lease.token,
            is_live=parts.lease.held_elsewhere,
        )
        parts.catalog.mark_indexed(COLLECTION, doc_id, chunks=CHUNKS_PER_DOC, pages=None, owner=parts.lease.token)


def build(parts: Parts, size: int, real: dict[str, np.ndarray], cosine: float) -> dict[str, Any]:
    """Write `size` chunks in the pipeline's batches; the write rate per WINDOW chunks as it grows."""
    rng = np.random.default_rng(size)
    batch = parts.settings.embed_batch
    texts, tokens, base = list(real["texts"]), [int(t) for t in real["tokens"]], real["vectors"]
    growth, window_started, window, total = [], time.perf_counter(), 0, 0.0
    for start in range(0, size, batch):
        n = min(batch, size - start)
        # The first len(base) chunks carry the real vectors unchanged; the rest are derived.
        index = np.arange(start, start + n) % len(base)
        vectors = base[index] if start + n <= len(base) else derived_vectors(base[index], n, cosine, rng)
        records = _records(start, [texts[i] for i in index], [tokens[i] for i in index])
        t0 = time.perf_counter()
        parts.pipeline.stores.write_chunks(COLLECTION, records, vectors.tolist())
        _catalog_indexed(parts, records)
        total += time.perf_counter() - t0
        window += n
        if window >= WINDOW or start + n == size:
            now = time.perf_counter()
            growth.append({"chunks": start + n, "chunks_per_s": round(window / max(now - window_started, 1e-9), 1)})
            window_started, window = now, 0
    return {"write_seconds": round(total, 1), "write_chunks_per_s": round(size / total, 1), "growth": growth}


async def _latency(parts: Parts, queries: list[str], k: int) -> dict[str, Any]:
    from rag.answering.retrieval import Retriever

    vectors = dict(zip(queries, await parts.embedder.embed(queries)))

    class AtHand:
        async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
            return [vectors[t] for t in texts]

    live = Retriever(parts.embedder, parts.store, parts.lexical, parts.catalog, parts.settings)
    at_hand = Retriever(AtHand(), parts.store, parts.lexical, parts.catalog, parts.settings)
    stages = {
        "embed+hybrid": lambda q: live.search(q, collection=COLLECTION, k=k),
        "hybrid": lambda q: at_hand.search(q, collection=COLLECTION, k=k),
        "dense": lambda q: at_hand.search(q, collection=COLLECTION, k=k, mode="dense"),
        "lexical": lambda q: at_hand.search(q, collection=COLLECTION, k=k, mode="lexical"),
        "embed": lambda q: parts.embedder.embed([q]),
    }
    out = {}
    for name, call in stages.items():
        for q in queries[:5]:  # warm: the first query loads the HNSW index into memory
            await call(q)
        ms = []
        for q in queries:
            started = time.perf_counter()
            await call(q)
            ms.append((time.perf_counter() - started) * 1000)
        out[name] = latency_summary(ms)
        print(
            f"    {name:<13} p50 {out[name]['p50']:7.1f}  p95 {out[name]['p95']:7.1f}  p99 {out[name]['p99']:7.1f} ms",
            file=sys.stderr,
            flush=True,
        )
    await live.aclose()
    await at_hand.aclose()
    return out


async def _size_job(
    settings: Settings, size: int, real_path: Path, cosine: float, queries: list[str]
) -> dict[str, Any]:
    with np.load(real_path, allow_pickle=True) as stored:
        real = {key: stored[key] for key in stored.files}
    parts = Parts(settings)
    try:
        built = build(parts, size, real, cosine)
        print(
            f"  built {size} chunks: writes {built['write_seconds']} s ({built['write_chunks_per_s']} chunks/s)",
            file=sys.stderr,
            flush=True,
        )
        count = parts.store.count(COLLECTION)
        latency = await _latency(parts, queries, settings.top_k)
    finally:
        await parts.aclose()
    return {**built, "stored": count, "latency_ms": latency}


async def _measure_job(settings: Settings, queries: list[str]) -> dict[str, Any]:
    """Latency again on a store built by an earlier run (--reuse)."""
    parts = Parts(settings)
    try:
        return {"stored": parts.store.count(COLLECTION), "latency_ms": await _latency(parts, queries, settings.top_k)}
    finally:
        await parts.aclose()


def _child(job: str, kwargs: dict[str, Any], result: Path) -> None:
    """Run one job in a fresh process and leave its result as JSON."""
    settings = Settings(**kwargs.pop("settings"))
    jobs = {"real": _embed_real, "size": _size_job, "measure": _measure_job}
    coro = jobs[job](settings, **kwargs)
    result.write_text(json.dumps(asyncio.run(coro)))


def in_child(job: str, result: Path, **kwargs: Any) -> dict[str, Any]:
    process = multiprocessing.get_context("spawn").Process(target=_child, args=(job, kwargs, result))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"the {job} job failed with exit code {process.exitcode}")
    return json.loads(result.read_text())


# ---------------------------------------------------------------- 3. the API on a built store


async def api_memory(data_dir: Path, embed_url: str, llm_url: str, queries: list[str], log_dir: Path) -> dict[str, Any]:
    from tests.servers import start_api

    env = clean_env(data_dir, RAG_EMBED_URL=embed_url, RAG_LLM_URL=llm_url, RAG_TOP_K="1", RAG_COLLECTION=COLLECTION)
    api = start_api(log_dir, env)
    try:
        started = rss_mb(api.pid)
        retrieval, statuses = [], []
        async with httpx.AsyncClient(base_url=api.url, timeout=120) as client:
            for q in queries:
                r = await client.post(
                    "/v1/chat", json={"messages": [{"role": "user", "content": q}], "stream": False, "max_tokens": 1}
                )
                statuses.append(r.status_code)
                if r.status_code == 200:
                    retrieval.append(r.json()["done"].get("retrieval_ms"))
        after = rss_mb(api.pid)
    finally:
        api.stop()
    return {
        "rss_after_start_mb": started["rss"],
        "rss_after_queries_mb": after["rss"],
        "peak_rss_mb": after["peak"],
        "chat_ok": statuses.count(200),
        "chat_other": len(statuses) - statuses.count(200),
        "retrieval_ms_in_api": latency_summary([r for r in retrieval if r is not None]),
    }


# ---------------------------------------------------------------- the plot


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [int(s) for s in results["sizes"]]
    runs = [results["sizes"][str(s)] for s in sizes]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    styles = {"embed+hybrid": "tab:red", "hybrid": "tab:blue", "dense": "tab:green", "lexical": "tab:orange"}
    for stage, colour in styles.items():
        for pct, line in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            left.plot(
                sizes,
                [r["latency_ms"][stage][pct] for r in runs],
                line,
                color=colour,
                marker="o",
                label=f"{stage} {pct}" if pct != "p99" else None,
            )
    left.axhline(50, color="grey", lw=0.8)
    left.text(sizes[0], 51, "target: embed+hybrid p95 <= 50 ms", fontsize=8, color="grey")
    left.set_xscale("log")
    left.set_xticks(sizes, [f"{s // 1000}k" if s >= 1000 else str(s) for s in sizes])
    left.set_xlabel("chunks in the collection")
    left.set_ylabel("ms per query (p50 solid, p95 dashed, p99 dotted)")
    left.set_title("query latency vs collection size")
    left.legend(fontsize=7, ncol=2)
    left.grid(alpha=0.3)
    biggest = runs[-1]["growth"]
    right.plot([g["chunks"] for g in biggest], [g["chunks_per_s"] for g in biggest], marker=".")
    right.set_xlabel("chunks in the collection")
    right.set_ylabel(f"chunks/s written (batches of {results['settings']['embed_batch']})")
    right.set_title(f"store write rate while growing to {sizes[-1]:,} (no embedding)")
    right.set_ylim(bottom=0)
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------- main


def machine() -> dict[str, Any]:
    import subprocess

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "host": platform.node(),
        "commit": commit.stdout.strip() or None,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _start_backends(workdir: Path, embed_url: str | None) -> tuple[list[Any], str, str]:
    from tests.servers import start_embedding_server

    servers = []
    if embed_url is None:
        servers.append(start_embedding_server(workdir, clean_env(workdir / "embedder")))
        embed_url = servers[-1].url
    servers.append(start_generator(workdir))
    return servers, embed_url, servers[-1].url


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    paragraphs, questions = squad_text()
    queries = random.Random(7).sample(questions, args.queries)
    servers, embed_url, llm_url = _start_backends(workdir, args.embed_url)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "sizes": {}}
    try:
        base = {"embed_url": embed_url, "llm_url": llm_url}
        real_path = workdir / "real.npz"
        if args.reuse and (workdir / "real.json").exists():
            results["real"] = json.loads((workdir / "real.json").read_text())
        else:
            print(
                f"embedding {args.real} real chunks through the pipeline and the embedding server ...", file=sys.stderr
            )
            results["real"] = in_child(
                "real",
                workdir / "real.json",
                settings={**base, "data_dir": str(workdir / "real")},
                paragraphs=paragraphs,
                target=args.real,
                out=real_path,
            )
        rate = results["real"]["chunks_per_s"]
        print(
            f"  {results['real']['chunks']} chunks in {results['real']['seconds']} s: {rate} chunks/s", file=sys.stderr
        )
        results["settings"] = Settings(**base, data_dir=workdir).model_dump(
            include={"embed_batch", "top_k", "retrieval_depth", "chunk_tokens", "hybrid_dense_weight"}
        )
        results["derivation"] = {
            "real_chunks": results["real"]["kept"],
            "cosine_to_real": args.cosine,
            "chunks_per_doc": CHUNKS_PER_DOC,
        }
        for size in sorted(args.sizes):
            print(f"size {size}:", file=sys.stderr)
            data_dir = workdir / f"size-{size}"
            settings = {**base, "data_dir": str(data_dir)}
            done = workdir / f"size-{size}.json"
            if args.reuse and done.exists() and data_dir.exists():
                one = json.loads(done.read_text())
                one.update(in_child("measure", workdir / f"measure-{size}.json", settings=settings, queries=queries))
                one["remeasured_at"] = time.strftime("%Y-%m-%d %H:%M")
            else:
                one = in_child(
                    "size", done, settings=settings, size=size, real_path=real_path, cosine=args.cosine, queries=queries
                )
            one["disk_mb"] = disk_mb(data_dir)
            one["projected_build_s"] = round(one["write_seconds"] + size / rate, 1)
            one["api"] = asyncio.run(api_memory(data_dir, embed_url, llm_url, queries[: args.chat_queries], workdir))
            print(
                f"  disk {one['disk_mb']} MiB, API RSS {one['api']['rss_after_start_mb']} -> "
                f"{one['api']['rss_after_queries_mb']} MiB",
                file=sys.stderr,
                flush=True,
            )
            results["sizes"][str(size)] = one
            if not args.keep:
                shutil.rmtree(data_dir, ignore_errors=True)
    finally:
        for server in servers:
            server.stop()
    results["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def summary(results: dict[str, Any]) -> str:
    real = results["real"]
    lines = [
        f"real embedding through the pipeline: {real['chunks']} chunks ({real['mean_tokens']} tokens mean) in "
        f"{real['seconds']} s = {real['chunks_per_s']} chunks/s, {real['tokens_per_s']} tokens/s",
        f"{'chunks':>8} {'write s':>8} {'build s*':>9} {'disk MiB':>9} {'emb+hyb p50':>12} {'p95':>7} {'p99':>7} "
        f"{'hybrid p95':>11} {'dense p95':>10} {'lex p95':>8} {'API RSS MiB':>12}",
    ]
    for size, r in results["sizes"].items():
        lat = r["latency_ms"]
        lines.append(
            f"{int(size):>8} {r['write_seconds']:>8} {r['projected_build_s']:>9} {r['disk_mb']:>9} "
            f"{lat['embed+hybrid']['p50']:>12} {lat['embed+hybrid']['p95']:>7} {lat['embed+hybrid']['p99']:>7} "
            f"{lat['hybrid']['p95']:>11} {lat['dense']['p95']:>10} {lat['lexical']['p95']:>8} "
            f"{r['api']['rss_after_start_mb']:>5}->{r['api']['rss_after_queries_mb']}"
        )
    lines.append("* build s = measured writes + chunks / the measured real embedding rate")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--real", type=int, default=2000, help="chunks embedded for real through the pipeline")
    parser.add_argument("--cosine", type=float, default=0.93, help="cosine of a derived vector to its real one")
    parser.add_argument("--queries", type=int, default=200, help="timed queries per stage and size")
    parser.add_argument("--chat-queries", type=int, default=20, help="chat requests to the API per size")
    parser.add_argument("--embed-url", default=None, help="a running embedding server (default: start one)")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the built stores in --workdir")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --workdir: measure again the stores an earlier --keep run built there",
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--plot", type=Path, default=RESULTS / "scale-latency.png")
    datasets.add_options(parser, "squad")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    with tempfile.TemporaryDirectory(prefix="rag-scale-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = run(args, workdir)
    write_json(args.json, results)
    plot(results, args.plot)
    print(summary(results))
    print(f"wrote {args.json} and {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
