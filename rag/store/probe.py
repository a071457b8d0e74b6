"""Opening an embedded Chroma store in a child process first, so that a crash of its engine is seen, not
suffered.

chromadb's Rust bindings can die with a segfault on a damaged store (a collection whose HNSW files and
write-ahead log disagree crashed `get_collection` in 1.5.9), taking the whole process with them. The
child opens each collection, counts it and runs one query on its index; it prints a JSON line before
and after each step, so when it dies the parent knows which collection killed it, marks that one
damaged and probes the rest in a new child. The child can also export a healthy collection's vectors
(`export`), which a repair uses instead of embedding the texts again, or list the ids of every healthy
collection (`ids`), which a check compares with the record.

    python -m rag.store.probe PATH [--skip NAME ...]      one JSON line per step
    python -m rag.store.probe PATH --export NAME FILE     ids and float16 vectors as .npz
    python -m rag.store.probe PATH --ids FILE [NAME ...]  per collection a JSON line of its ids
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag.core.lifetime import die_with_parent
from rag.store.chroma_vectors import persistent_client

PROBE_TIMEOUT_S = 120.0
SAMPLES = 20  # stored vectors per collection that the index must find
TWIN = 0.01  # cosine distance under which a hit stands for the vector searched (its text's twin)


@dataclass
class ChromaProbe:
    """What a child process found in an embedded Chroma store."""

    counts: dict[str, int] = field(default_factory=dict)  # the healthy collections and their vectors
    damaged: dict[str, str] = field(default_factory=dict)  # collection -> what happened
    unreadable: str | None = None  # the store as a whole could not be opened

    @property
    def ok(self) -> bool:
        return not self.damaged and self.unreadable is None

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "damaged": self.damaged, "unreadable": self.unreadable}


def probe_chroma(path: Path, timeout_s: float = PROBE_TIMEOUT_S) -> ChromaProbe:
    """Open every collection under `path` in child processes; never raises for a damaged store."""
    found = ChromaProbe()
    if not (path / "chroma.sqlite3").exists():
        return found
    while True:
        lines, died = _run_child([str(path), "--skip", *found.damaged], timeout_s)
        opened = None
        for line in lines:
            if "open" in line:
                opened = line["open"]
            elif "ok" in line:
                found.counts[line["ok"]] = int(line["count"])
                opened = None
            elif "error" in line:
                found.damaged[line["error"]] = line["message"]
                opened = None
        if died is None:
            return found
        if opened is None:  # it died before or between collections: the store itself
            found.unreadable = died
            return found
        found.damaged[opened] = died


def export_vectors(
    path: Path, collection: str, out: Path, timeout_s: float = 600.0
) -> dict[str, tuple[list[float], dict[str, Any]]] | None:
    """The vectors and metadata of a healthy collection by chunk id, read in a child; None if it failed."""

    _, died = _run_child([str(path), "--export", collection, str(out)], timeout_s)
    if died is not None or not out.exists():
        return None
    with np.load(out) as data:
        ids, vectors = data["ids"].tolist(), data["vectors"].astype(np.float32)
        metadatas = json.loads(str(data["metadatas"]))
    out.unlink()
    return {i: (v.tolist(), m or {}) for i, v, m in zip(ids, vectors, metadatas)}


def chroma_ids(path: Path, collections: list[str], out: Path, timeout_s: float = 600.0) -> dict[str, set[str]] | None:
    """The chunk ids Chroma holds in each of `collections` (healthy ones: probed first), read in a
    child; None if it failed."""
    if not collections:
        return {}
    _, died = _run_child([str(path), "--ids", str(out), *collections], timeout_s)
    if died is not None or not out.exists():
        return None
    try:
        return {line["collection"]: set(line["ids"]) for line in _lines(out.read_text())}
    finally:
        out.unlink()


def _run_child(args: list[str], timeout_s: float) -> tuple[list[dict[str, Any]], str | None]:
    """The child's JSON lines, and how it died (None when it exited cleanly)."""
    env = dict(os.environ, PYTHONFAULTHANDLER="0")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rag.store.probe", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            preexec_fn=die_with_parent(),  # a killed API leaves no probe behind (the thread waits on it)
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return _lines(out), f"Chroma did not answer within {timeout_s:.0f} s"
    lines = _lines(done.stdout)
    if done.returncode == 0:
        return lines, None
    if done.returncode < 0:
        return lines, f"Chroma's engine crashed (signal {-done.returncode})"
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return lines, f"Chroma failed (exit {done.returncode}): {last[:300]}"


def _lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


# The child.


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _probe(path: str, skip: set[str]) -> None:
    client = persistent_client(path)
    names = sorted(c.name for c in client.list_collections())
    _say(collections=names)
    for name in names:
        if name in skip:
            continue
        _say(open=name)
        try:
            coll = client.get_collection(name, embedding_function=None)
            count = coll.count()
            lost = _lost_vectors(coll, count)
        except Exception as exc:  # any failure of one collection is that collection's damage
            _say(error=name, message=f"{exc.__class__.__name__}: {exc}"[:500])
            continue
        if lost:
            _say(error=name, message=lost)
        else:
            _say(ok=name, count=count)


def _lost_vectors(coll: Any, count: int, samples: int = SAMPLES, k: int = 10) -> str | None:
    """Query the index with stored vectors spread over the collection; each must be there: found among its
    k nearest by its id or as an equal vector (a chunk of the same text), else read back by its id. Many
    equal vectors leave others out of the HNSW graph's reach (its neighbour selection drops equal
    neighbours), so a search by such a vector finds only its twins, or only other texts, although it is
    stored: by exact identity that was a false alarm that made a repetitive collection unusable."""
    tried = missed = 0
    for offset in range(0, count, max(1, count // samples)):
        got = coll.get(limit=1, offset=offset, include=["embeddings"])
        if not got["ids"]:
            continue
        tried += 1
        missed += not _found(coll, got["ids"][0], np.asarray(got["embeddings"][0], dtype=np.float32), k)
    return f"the index does not find {missed} of {tried} stored vectors sampled" if missed else None


def _found(coll: Any, chunk_id: str, vector: Any, k: int) -> bool:
    hit = coll.query(query_embeddings=[vector.tolist()], n_results=k, include=["distances"])
    ids, distances = hit["ids"][0], hit["distances"][0]
    if not ids:
        return False  # an index that answers nothing has lost its vectors
    if chunk_id in ids or any(float(d) <= TWIN for d in distances):
        return True
    again = coll.get(ids=[chunk_id], include=["embeddings"])
    return bool(again["ids"]) and np.allclose(np.asarray(again["embeddings"][0], dtype=np.float32), vector)


def _export(path: str, name: str, out: str) -> None:

    coll = persistent_client(path).get_collection(name, embedding_function=None)
    ids: list[str] = []
    vectors: list[Any] = []
    metadatas: list[Any] = []
    step = 2000
    for offset in range(0, coll.count(), step):
        got = coll.get(limit=step, offset=offset, include=["embeddings", "metadatas"])
        ids += got["ids"]
        vectors += list(got["embeddings"])
        metadatas += [dict(m or {}) for m in got["metadatas"]]
    array = np.asarray(vectors, dtype=np.float16) if vectors else np.zeros((0, 0), dtype=np.float16)
    with open(out, "wb") as f:
        np.savez(f, ids=np.asarray(ids), vectors=array, metadatas=np.asarray(json.dumps(metadatas)))
    _say(exported=name, count=len(ids))


def _ids(path: str, out: str, names: list[str]) -> None:
    client = persistent_client(path)
    step = 5000
    with open(out, "w") as f:
        for name in names:
            coll = client.get_collection(name, embedding_function=None)
            ids: list[str] = []
            for offset in range(0, coll.count(), step):
                ids += coll.get(limit=step, offset=offset, include=[])["ids"]
            f.write(json.dumps({"collection": name, "ids": ids}) + "\n")
    _say(listed=len(names))


def main(argv: list[str]) -> None:
    path, *rest = argv
    if rest[:1] == ["--export"]:
        _export(path, rest[1], rest[2])
    elif rest[:1] == ["--ids"]:
        _ids(path, rest[1], rest[2:])
    else:
        _probe(path, set(rest[1:]) if rest[:1] == ["--skip"] else set())


if __name__ == "__main__":
    main(sys.argv[1:])
