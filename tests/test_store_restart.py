"""The store across a graceful restart, reopened in a new process: the same top 10 for the same queries
(dense and BM25), and a collection of many equal vectors is not called damaged by the start-up probe,
nor after a repair."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag.core.config import Settings
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex
from rag.store.probe import probe_chroma
from rag.store.repair import check_store, repair_store
from tests.ingest_helpers import open_pipeline, paragraph_chunks

DIMS = 384

REOPENED = """
import json, sys
from rag.core.config import Settings
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex

data_dir, collection, queries = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
settings = Settings(data_dir=data_dir)
store, lexical = ChunkStore.open(settings), LexicalIndex(settings.data_dir / "lexical.sqlite")
print(json.dumps({
    "dense": [[h.id for h in store.query(collection, q, 10, texts=False)] for q in queries["vectors"]],
    "lexical": [[h.chunk_id for h in lexical.search(collection, q, 10)] for q in queries["texts"]],
}))
"""


def _top_in_a_new_process(settings: Settings, collection: str, vectors: list, texts: list[str], tmp: Path) -> dict:
    file = tmp / "queries.json"
    file.write_text(json.dumps({"vectors": vectors, "texts": texts}))
    done = subprocess.run(
        [sys.executable, "-c", REOPENED, str(settings.data_dir), collection, str(file)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def _repetitive_vectors(n: int, distinct: int, seed: int = 0) -> np.ndarray:
    """`n` vectors of which most repeat one of `distinct` (chunks of the same text), one in seven a near twin."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(distinct, DIMS)).astype(np.float32)
    vectors = base[np.arange(n) % distinct]
    vectors[::7] += rng.normal(scale=0.05, size=vectors[::7].shape).astype(np.float32)
    return vectors


def _vectors_and_queries() -> tuple[np.ndarray, list[list[float]]]:
    """6,400 vectors, more than half of them repeating 40 (HNSW's hardest case: equal neighbours), and 20 queries."""
    rng = np.random.default_rng(5)
    vectors = np.vstack([_repetitive_vectors(3400, 40), rng.normal(size=(3000, DIMS)).astype(np.float32)])
    return vectors, rng.normal(size=(20, DIMS)).astype(np.float32).tolist()


def _write(store: ChunkStore, collection: str, vectors: np.ndarray) -> None:
    ids = [f"doc{i // 50}:{i % 50}" for i in range(len(vectors))]
    metadatas = [{"doc_id": i.split(":")[0]} for i in ids]
    store.upsert(collection, ids, vectors.tolist(), ["text"] * len(ids), metadatas)


def test_the_dense_top_10_is_the_same_after_a_restart(isolated_env: Path, tmp_path: Path) -> None:
    """6,400 vectors (a tail past Chroma's sync threshold of 1,000, many equal): 20 queries' top 10 in the
    writing process, then in a new one."""
    settings = Settings(data_dir=isolated_env)
    vectors, queries = _vectors_and_queries()
    store = ChunkStore.open(settings)
    _write(store, "alpha", vectors)
    before = [[h.id for h in store.query("alpha", q, 10, texts=False)] for q in queries]
    after = _top_in_a_new_process(settings, "alpha", queries, [], tmp_path)
    assert after["dense"] == before


def test_a_collection_made_with_the_old_settings_is_stable_after_its_first_reopening(
    isolated_env: Path, tmp_path: Path
) -> None:
    from rag.store import chroma_vectors

    settings = Settings(data_dir=isolated_env)
    old = {k: v for k, v in chroma_vectors.HNSW.items() if k != "sync_threshold"}  # Chroma's default then: 1000
    client = chroma_vectors.persistent_client(settings.chroma_path)
    coll = client.get_or_create_collection("alpha", configuration={"hnsw": old}, embedding_function=None)
    vectors, queries = _vectors_and_queries()
    for start in range(0, len(vectors), 1000):
        part = vectors[start : start + 1000]
        coll.upsert(ids=[f"d:{start + i}" for i in range(len(part))], embeddings=part.tolist())
    first = _top_in_a_new_process(settings, "alpha", queries, [], tmp_path)  # settles the collection
    for _ in range(2):
        assert _top_in_a_new_process(settings, "alpha", queries, [], tmp_path) == first


def test_a_collection_of_many_equal_vectors_is_not_called_damaged_after_a_restart(isolated_env: Path) -> None:
    """3,369 chunks of three texts (and near twins): the probe, a new process, finds every sampled vector;
    `rag store check` agrees, and so it does after a repair."""
    settings = Settings(data_dir=isolated_env)
    store = ChunkStore.open(settings)
    _write(store, "repeated", _repetitive_vectors(3369, 3))
    probe = probe_chroma(settings.chroma_path)
    assert probe.ok and probe.counts == {"repeated": 3369}, probe.to_dict()


def test_a_repaired_repetitive_collection_is_healthy(isolated_env: Path, tmp_path: Path) -> None:
    from tests.ingest_helpers import HashEmbedder

    settings = Settings(data_dir=isolated_env, embed_batch=64)
    folder = tmp_path / "in"
    folder.mkdir()
    files = []
    for i in range(20):
        path = folder / f"f{i}.txt"
        path.write_text("\n\n".join(f"The same notice, line {j % 3}." for j in range(100)) + f"\n\nfile {i}")
        files.append(path)
    from ingest.pipeline import SourceFile

    pipeline = open_pipeline(settings, HashEmbedder(dim=DIMS), paragraph_chunks)
    asyncio.run(pipeline.run([SourceFile(p, str(p), p.name) for p in files], "repeated"))
    pipeline.lexical.close()
    pipeline.catalog.close()
    pipeline.lease.release()
    from chromadb.api.shared_system_client import SharedSystemClient

    SharedSystemClient.clear_system_cache()
    assert check_store(settings.data_dir, settings.chroma_path).consistent
    repair_store(settings.data_dir, settings.chroma_path, embed=None)
    report = check_store(settings.data_dir, settings.chroma_path)
    assert report.consistent and report.probe.ok, report.to_dict()


@pytest.mark.integration
def test_hybrid_top_10_of_real_embeddings_is_the_same_after_a_restart(
    ingest_settings: Settings, tmp_path: Path
) -> None:
    """3,050 chunks of synthetic text, 150 paragraphs repeated, embedded by all-MiniLM-L6-v2 (a tail of 50
    past Chroma's sync threshold of 1,000): 20 queries' dense and BM25 top 10 in the writing process, then
    in a new one."""
    from ingest.pipeline import SourceFile
    from rag.clients.embedding import EmbeddingClient

    rng = np.random.default_rng(7)
    words = [f"{a}{b}" for a in ("kal", "mor", "tesh", "vin", "dro", "pel") for b in ("ana", "ek", "ith", "or", "um")]
    folder = tmp_path / "docs"
    folder.mkdir()
    files = []
    pool = [" ".join(rng.choice(words, 12)) + f" report {j % 7}." for j in range(150)]  # repeated, as in boilerplate
    for i in range(61):
        paragraphs = list(rng.choice(pool, 50))
        (folder / f"d{i}.txt").write_text("\n\n".join(paragraphs))
        files.append(SourceFile(folder / f"d{i}.txt", str(folder / f"d{i}.txt"), f"d{i}.txt"))
    texts = [" ".join(rng.choice(words, 4)) for _ in range(20)]

    async def index_and_query() -> tuple[list, list, list]:
        embedder = EmbeddingClient(ingest_settings.embed_url, model=ingest_settings.embed_model)
        pipeline = open_pipeline(ingest_settings, embedder, paragraph_chunks)
        try:
            await pipeline.run(files, "synthetic")
            vectors = (await embedder.embed(texts, kind="query")).tolist()
        finally:
            await embedder.aclose()
        dense = [[h.id for h in pipeline.store.query("synthetic", v, 10, texts=False)] for v in vectors]
        lexical = [[h.chunk_id for h in pipeline.lexical.search("synthetic", t, 10)] for t in texts]
        pipeline.lexical.close()
        pipeline.catalog.close()
        pipeline.lease.release()
        return vectors, dense, lexical

    vectors, dense, lexical = asyncio.run(index_and_query())
    assert LexicalIndex(ingest_settings.data_dir / "lexical.sqlite").count("synthetic") == 3050
    after = _top_in_a_new_process(ingest_settings, "synthetic", vectors, texts, tmp_path)
    assert after == {"dense": dense, "lexical": lexical}
