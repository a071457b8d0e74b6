"""Helpers of the ingestion tests: a deterministic embedder for unit tests, and a census of the stores."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ingest.pipeline import ChunkRecord, IngestPipeline, LoaderPreparer, Prepared, SourceFile
from rag.core.config import Settings
from rag.core.errors import EmbedderUnavailable
from rag.store.catalog import DocumentCatalog, OwnerLease
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex


@dataclass
class HashEmbedder:
    """Deterministic unit vectors from the text's hash; records every call (unit tests only)."""

    dim: int = 16
    calls: list[list[str]] = field(default_factory=list)
    fail_after: int | None = None  # calls that succeed before every later one fails
    delay_s: float = 0.0
    concurrent: int = 0
    max_concurrent: int = 0

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.fail_after is not None and len(self.calls) >= self.fail_after:
                raise EmbedderUnavailable("embedding server at http://test is unreachable")
            self.calls.append(list(texts))
            return [self._vector(t) for t in texts]
        finally:
            self.concurrent -= 1

    def _vector(self, text: str) -> list[float]:
        digest = hashlib.sha256(text.encode()).digest()
        raw = [b - 127.5 for b in digest[: self.dim]]
        norm = sum(x * x for x in raw) ** 0.5
        return [x / norm for x in raw]

    @property
    def texts(self) -> int:
        return sum(len(c) for c in self.calls)


def paragraph_chunks(data: bytes, file: SourceFile, doc_id: str) -> Prepared:
    """A stand-in for the loaders: one chunk per blank-line-separated paragraph of UTF-8 text."""
    text = data.decode("utf-8")
    if text.startswith("FAIL"):
        from rag.core.errors import DocumentRejected

        raise DocumentRejected(f"{file.name}: asked to fail")
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    return Prepared(
        [
            ChunkRecord(f"{doc_id}:{i}", p, {"doc_id": doc_id, "chunk_index": i, "source": file.name})
            for i, p in enumerate(paragraphs)
        ]
    )


def open_pipeline(settings: Settings, embedder: object, prepare: object = None, **kwargs: object) -> IngestPipeline:
    """A pipeline over the stores in `settings.data_dir` (the caller owns the embedded store)."""
    return IngestPipeline(
        settings,
        embedder,  # type: ignore[arg-type]
        ChunkStore.open(settings),
        LexicalIndex(settings.data_dir / "lexical.sqlite"),
        DocumentCatalog(settings.data_dir / "catalog.sqlite"),
        OwnerLease(settings.data_dir / "owners"),
        prepare=prepare,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


@dataclass
class Census:
    """Chunks per document id in Chroma and in the lexical index, and the catalog's states."""

    chroma: Counter[str]
    lexical: Counter[str]
    states: dict[str, str]
    catalog_chunks: dict[str, int]

    def indexed(self) -> dict[str, int]:
        return {d: n for d, n in self.catalog_chunks.items() if self.states[d] == "indexed"}

    def consistent(self) -> bool:
        """Every stored chunk belongs to an indexed document, which has exactly its catalogued chunks."""
        return dict(self.chroma) == self.indexed() == dict(self.lexical)


def census(data_dir: Path, collection: str, store: ChunkStore | None = None) -> Census:
    """Count what is stored; opens the embedded store unless given one (never while another process has it)."""
    store = store or ChunkStore.open(Settings(data_dir=data_dir))
    got = store.collection(collection).get(include=["metadatas"]) if store.exists(collection) else {"metadatas": []}
    chroma = Counter(str(m["doc_id"]) for m in got["metadatas"])
    with sqlite3.connect(data_dir / "lexical.sqlite") as db:
        rows = db.execute("SELECT doc_id, count(*) FROM chunks WHERE collection = ? GROUP BY doc_id", (collection,))
        lexical = Counter({d: n for d, n in rows})
    catalog = DocumentCatalog(data_dir / "catalog.sqlite")
    try:
        records = catalog.list(collection, 0, 1 << 30)
    finally:
        catalog.close()
    return Census(chroma, lexical, {r.doc_id: r.state for r in records}, {r.doc_id: r.chunks for r in records})


def expected_chunks(paths: list[Path], settings: Settings) -> dict[str, int]:
    """What chunking produces for each file, by document id (the real loaders and chunker)."""
    from ingest.pipeline import document_id

    prepare = LoaderPreparer(settings)
    expected = {}
    for path in paths:
        data = path.read_bytes()
        doc_id = document_id(data)
        expected[doc_id] = len(prepare(data, SourceFile(path, str(path), path.name), doc_id).records)
    return expected
