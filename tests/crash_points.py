"""kill -9 at random points of an ingest, through the `ingest` CLI on the store or through the API, then a
restart and a re-run: shared by `tests/test_crash_points.py` and `bench/crash_points.py`.

A kill point is a number of documents indexed (drawn at random, spread over the corpus) plus a random
delay, so the kill lands anywhere in a document's life: loading, embedding, the Chroma write, the record
and BM25 writes, the catalog switch. After each kill the product's own start-up runs (`ingest` on an
empty folder for the CLI path, a new API for the API path: both take out what the dead process left),
and every document is counted in the catalog, the record (the chunks table of `lexical.sqlite`),
Chroma and the BM25 index. The last run goes to the end: every file is then indexed exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rag.core.config import Settings
from rag.store.catalog import DocumentCatalog
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex
from tests.data import SQUAD
from tests.ingest_helpers import expected_chunks
from tests.servers import Server, free_port, start_api

COLLECTION = "default"
PATHS = ("cli", "api")


def write_texts(folder: Path, n: int, squad: Path = SQUAD) -> list[Path]:
    """`n` distinct paragraphs of a SQuAD-format set as small text files (a chunk or two each)."""
    folder.mkdir(parents=True, exist_ok=True)
    contexts = [p["context"] for a in json.loads(squad.read_text())["data"] for p in a["paragraphs"]]
    unique = list(dict.fromkeys(contexts))[:n]
    if len(unique) < n:
        raise ValueError(f"{squad} holds {len(unique)} distinct paragraphs, fewer than {n}: give a larger set")
    paths = []
    for i, text in enumerate(unique):
        path = folder / f"doc-{i:04d}.txt"
        path.write_text(text)
        paths.append(path)
    return paths


def kill_points(rng: random.Random, n: int, files: int) -> list[tuple[int, float]]:
    """`n` kill points (documents indexed, then a delay in seconds), one drawn in each of `n` equal
    stretches of the first 90% of the corpus, so they spread over the whole ingest."""
    span = 0.9 * files / n
    return [(int(rng.uniform(i * span, (i + 1) * span)), rng.uniform(0.0, 0.5)) for i in range(n)]


# Counting.


@dataclass
class Survey:
    """Per document: its catalog state, catalog chunks, record rows, Chroma ids and BM25 documents."""

    states: dict[str, str]
    sources: dict[str, str]
    counts: dict[str, tuple[int, int, int, int]]  # catalog, record, Chroma, BM25
    stray_chroma: int  # Chroma ids of documents the catalog does not know
    stray_record: int
    stray_bm25: int

    def problems(self, expected: dict[str, int], complete: bool) -> list[str]:
        """What breaks the target: a document not indexed, counts that disagree, a chunk without a
        document, a file indexed twice or with the wrong chunks; with `complete`, a file missing."""
        out = [f"{d[:12]} is {s}" for d, s in self.states.items() if s != "indexed"]
        out += [
            f"{d[:12]} counts {c} (catalog, record, Chroma, BM25)"
            for d, c in self.counts.items()
            if len(set(c)) != 1 or c[0] != expected.get(d)
        ]
        out += [
            f"{n} {where} chunks belong to no document"
            for n, where in ((self.stray_chroma, "Chroma"), (self.stray_record, "record"), (self.stray_bm25, "BM25"))
            if n
        ]
        if len(set(self.sources.values())) != len(self.sources):
            out.append("a file is indexed under two documents")
        if complete and set(self.states) != set(expected):
            out.append(
                f"{len(set(expected) - set(self.states))} files missing, {len(set(self.states) - set(expected))} unknown documents"
            )
        return out


def survey(data_dir: Path) -> Survey:
    """Count the store as it lies on disk (no process may hold it)."""
    catalog = DocumentCatalog(data_dir / "catalog.sqlite")
    try:
        rows = catalog.list(COLLECTION, 0, 1 << 30)
    finally:
        catalog.close()
    store = ChunkStore.open(Settings(data_dir=data_dir))
    metas = store.collection(COLLECTION).get(include=["metadatas"])["metadatas"] if store.exists(COLLECTION) else []
    chroma: dict[str, int] = {}
    for meta in metas:
        chroma[str(meta["doc_id"])] = chroma.get(str(meta["doc_id"]), 0) + 1
    lexical = LexicalIndex(data_dir / "lexical.sqlite")
    try:
        record = {d: n for d, (n, _) in lexical.document_counts(COLLECTION).items()}
        ids = [r.doc_id for r in rows]
        bm25 = lexical.search_counts(COLLECTION, ids)
        bm25_total = lexical.search_count()
    finally:
        lexical.close()
    known = set(ids)
    return Survey(
        states={r.doc_id: r.state for r in rows},
        sources={r.doc_id: r.source for r in rows},
        counts={r.doc_id: (r.chunks, record.get(r.doc_id, 0), chroma.get(r.doc_id, 0), bm25[r.doc_id]) for r in rows},
        stray_chroma=sum(n for d, n in chroma.items() if d not in known),
        stray_record=sum(n for d, n in record.items() if d not in known),
        stray_bm25=bm25_total - sum(bm25.values()),
    )


def indexed(data_dir: Path) -> int:
    """Documents indexed so far, read as another process would."""
    path = data_dir / "catalog.sqlite"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT count(*) FROM documents WHERE state = 'indexed'").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def pending(data_dir: Path) -> int:
    with sqlite3.connect(f"file:{data_dir / 'catalog.sqlite'}?mode=ro", uri=True, timeout=5) as db:
        return int(db.execute("SELECT count(*) FROM documents WHERE state != 'indexed'").fetchone()[0])


# Processes.


def ingest_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ingest.cli", *args]


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def reap(process: subprocess.Popen) -> None:
    """Stop what is left of a process's group (its parser workers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def kill_at(
    victim: subprocess.Popen,
    data_dir: Path,
    target: int,
    delay_s: float,
    alive: Callable[[], bool],
    timeout: float = 600,
) -> int | None:
    """SIGKILL `victim` `delay_s` after `target` documents are indexed; the count then, or None when the
    ingest ended first (`alive` says whether it still runs)."""
    deadline = time.monotonic() + timeout
    while indexed(data_dir) < target:
        if not alive() or time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    time.sleep(delay_s)
    if not alive():
        return None
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    return indexed(data_dir)


# The two paths.


@dataclass
class KillResult:
    path: str
    target: int
    delay_s: float
    at: int | None  # documents indexed when killed; None: the ingest ended first
    left: int  # pending or deleting rows the kill left
    after: int  # documents indexed after the restart
    problems: list[str]
    restart_s: float


@dataclass
class PathResult:
    path: str
    kills: list[KillResult] = field(default_factory=list)
    final: list[str] = field(default_factory=list)
    final_documents: int = 0
    wall_s: float = 0.0


class Runner:
    """One crash series over `corpus` into `data_dir`, through `path` ("cli" or "api")."""

    def __init__(self, path: str, corpus: Path, data_dir: Path, env: dict[str, str], work: Path) -> None:
        self.path, self.corpus, self.data_dir, self.work = path, corpus, data_dir, work
        # Small embedding batches: documents finish one by one, so the kills land between and inside them.
        self.env = {**env, "RAG_DATA_DIR": str(data_dir), "RAG_API_PORT": str(free_port()), "RAG_EMBED_BATCH": "16"}
        self.log = work / f"ingest-{path}.log"
        self.api: Server | None = None

    def run(self, points: list[tuple[int, float]], expected: dict[str, int]) -> PathResult:
        started = time.monotonic()
        result = PathResult(self.path)
        try:
            for target, delay in points:
                result.kills.append(self.kill_once(target, delay, expected))
            self.start_api()
            done = subprocess.run(self.ingest(), env=self.env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                result.final.append(f"the re-run exited {done.returncode}: {done.stderr[-500:]}")
        finally:
            self.stop_api()
        now = survey(self.data_dir)
        result.final += now.problems(expected, complete=True)
        result.final_documents = sum(s == "indexed" for s in now.states.values())
        result.wall_s = time.monotonic() - started
        return result

    def kill_once(self, target: int, delay: float, expected: dict[str, int]) -> KillResult:
        self.start_api()
        cli = spawn(self.ingest(), self.env, self.log)
        victim = cli if self.api is None else self.api.process
        try:
            at = kill_at(victim, self.data_dir, target, delay, alive=lambda: cli.poll() is None)
        finally:
            reap(cli)
            self.stop_api()
        left = pending(self.data_dir)
        restarted = time.monotonic()
        self.restart()
        restart_s = time.monotonic() - restarted
        now = survey(self.data_dir)
        return KillResult(
            self.path,
            target,
            delay,
            at,
            left,
            sum(s == "indexed" for s in now.states.values()),
            now.problems(expected, complete=False),
            restart_s,
        )

    def ingest(self) -> list[str]:
        server = ["--server", self.api.url] if self.api else []
        return ingest_command(str(self.corpus), *server)

    def restart(self) -> None:
        """The product's start-up, which takes out what a dead process left: then stopped again."""
        if self.path == "api":
            self.start_api()
            self.stop_api()
        else:  # the CLI recovers when it opens the store, before reading its files
            empty = self.work / "empty"
            empty.mkdir(exist_ok=True)
            subprocess.run(ingest_command(str(empty)), env=self.env, capture_output=True, check=True, timeout=300)

    def start_api(self) -> None:
        if self.path == "api" and self.api is None:
            self.api = start_api(self.work, self.env, ready_path="/v1/collections")

    def stop_api(self) -> None:
        if self.api is not None:
            if self.api.process.poll() is None:
                self.api.stop()
            reap(self.api.process)
            self.api = None


def run_series(
    path: str, files: int, kills: int, seed: int, env: dict[str, str], work: Path, squad: Path = SQUAD
) -> PathResult:
    """Write `files` texts, then kill an ingest of them `kills` times through `path` and finish it."""
    corpus = work / "corpus"
    paths = write_texts(corpus, files, squad) if not corpus.exists() else sorted(corpus.glob("*.txt"))
    data_dir = work / f"data-{path}"
    expected = expected_chunks(paths, Settings(data_dir=data_dir))
    points = kill_points(random.Random(f"{seed}-{path}"), kills, files)
    return Runner(path, corpus, data_dir, env, work).run(points, expected)
