"""The record, `rag store check` and `rag store repair`: stores damaged on purpose are found out and
rebuilt from the record with nothing indexed lost; a store whose Chroma engine crashes when a collection is
opened starts, reports and repairs (one made here, and, when RAG_TEST_DAMAGED_STORE names its archive, one
found in the field).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from ingest.pipeline import IngestPipeline, SourceFile
from rag.core.config import Settings
from rag.core.errors import EmbedderMismatch
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex
from rag.store.probe import probe_chroma
from rag.store.repair import check_store, reindex_collection, repair_store
from tests.ingest_helpers import HashEmbedder, census, open_pipeline, paragraph_chunks
from tests.servers import start_api

# A whole RAG_DATA_DIR as the stack left it after a segfault in Chroma's engine (18 MB, kept outside the
# repository): `get_collection("default")` crashes chromadb 1.5.9.
# Read at import: every test runs with the RAG_* variables cleared.
FIELD_STORE = "RAG_TEST_DAMAGED_STORE"
FIELD_ARCHIVE = os.environ.get(FIELD_STORE)


def _forget_chroma() -> None:
    """Close this process's Chroma clients, as a stopped API would."""
    from chromadb.api.shared_system_client import SharedSystemClient

    SharedSystemClient.clear_system_cache()


def _ingest(settings: Settings, tmp_path: Path) -> IngestPipeline:
    """alpha: 1,200 chunks (past Chroma's sync threshold of 1,000, so its index files are written and
    its log purged); beta: 200."""
    pipeline = open_pipeline(settings, HashEmbedder(), paragraph_chunks)
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    sources = []
    for i in range(35):
        path = folder / f"f{i}.txt"
        path.write_text("\n\n".join(f"file {i} paragraph {j} about topic {i}-{j}." for j in range(40)))
        sources.append(SourceFile(path, str(path), path.name))
    asyncio.run(pipeline.run(sources[:30], "alpha"))
    asyncio.run(pipeline.run(sources[30:], "beta"))
    return pipeline


def _top(store: ChunkStore, collection: str, queries: np.ndarray, k: int = 10) -> list[list[str]]:
    return [[h.id for h in store.query(collection, q.tolist(), k)] for q in queries]


SIZES = {"alpha": 1200, "beta": 200}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("pristine")
    settings = Settings(data_dir=root / "data", embed_batch=64)
    pipeline = _ingest(settings, root)
    queries = np.random.default_rng(7).normal(size=(20, 16)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    before = {c: _top(pipeline.store, c, queries) for c in SIZES}
    pipeline.lexical.close()
    pipeline.catalog.close()
    pipeline.lease.release()
    _forget_chroma()
    return settings.data_dir, queries, before


@pytest.fixture
def built(pristine, isolated_env: Path):
    source, queries, before = pristine
    shutil.rmtree(isolated_env, ignore_errors=True)
    shutil.copytree(source, isolated_env)
    return Settings(data_dir=isolated_env, embed_batch=64), queries, before


def test_the_record_keeps_every_chunk_with_its_vector_and_embedder(built) -> None:
    settings, _, _ = built
    report = check_store(settings.data_dir, settings.chroma_path)
    assert report.consistent, report.to_dict()
    for c in report.collections:
        assert c.catalog_chunks == c.record_chunks == c.record_vectors == c.chroma == SIZES[c.name]
    lexical = LexicalIndex(settings.data_dir / "lexical.sqlite")
    try:
        identity = lexical.embedder("alpha")
        assert identity is not None and identity.dimensions == 16 and identity.normalized
    finally:
        lexical.close()


def test_a_restart_keeps_the_top_k(built) -> None:
    """1,400 chunks, the store closed and opened again: every query's top 10 in the same order."""
    settings, queries, before = built
    store = ChunkStore.open(settings)
    assert {c: _top(store, c, queries) for c in SIZES} == before


def _segment_dirs(chroma: Path) -> list[Path]:
    return [p for p in chroma.iterdir() if p.is_dir()]


def _delete_segment_folders(chroma: Path) -> None:
    for folder in _segment_dirs(chroma):
        shutil.rmtree(folder)


def _truncate_hnsw(chroma: Path, collection: str | None = None) -> None:
    """Cut every HNSW file (or those of one collection) to a third: opening the collection then crashes Chroma."""
    for folder in _segment_dirs(chroma) if collection is None else [chroma / _vector_segment(chroma, collection)]:
        for name in ("data_level0.bin", "link_lists.bin", "header.bin"):
            path = folder / name
            if path.exists():
                path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 3)])


def _vector_segment(chroma: Path, collection: str) -> str:
    with sqlite3.connect(f"file:{chroma / 'chroma.sqlite3'}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT s.id FROM segments s JOIN collections c ON s.collection = c.id "
            "WHERE c.name = ? AND s.scope = 'VECTOR'",
            (collection,),
        ).fetchone()
    return str(row[0])


def _drop_rows(chroma: Path) -> None:
    with sqlite3.connect(chroma / "chroma.sqlite3") as db:
        db.execute("DELETE FROM embeddings WHERE id IN (SELECT id FROM embeddings ORDER BY id DESC LIMIT 100)")


def _add_orphans(chroma: Path) -> None:
    """Vectors in Chroma that the record never held (a write cut short by a full disk leaves such)."""
    import chromadb

    client = chromadb.PersistentClient(path=str(chroma))
    coll = client.get_collection("alpha", embedding_function=None)
    sample = coll.get(limit=1, include=["embeddings", "documents", "metadatas"])
    coll.add(
        ids=[f"orphan:{i}" for i in range(5)],
        embeddings=[sample["embeddings"][0]] * 5,
        documents=["orphan"] * 5,
        metadatas=[sample["metadatas"][0]] * 5,
    )


def _swap_vectors(chroma: Path) -> None:
    """Five indexed chunks lose their vector and five orphans take their place: the counts agree."""
    import chromadb

    coll = chromadb.PersistentClient(path=str(chroma)).get_collection("alpha", embedding_function=None)
    lost = coll.get(limit=5, include=["embeddings", "metadatas"])
    coll.delete(ids=lost["ids"])
    coll.add(
        ids=[f"orphan:{i}" for i in range(5)],
        embeddings=list(lost["embeddings"]),
        documents=["orphan"] * 5,
        metadatas=list(lost["metadatas"]),
    )


@pytest.mark.parametrize(
    "damage",
    [_delete_segment_folders, _truncate_hnsw, _drop_rows, _add_orphans, _swap_vectors],
    ids=["deleted segment folder", "truncated HNSW files", "missing rows", "orphan vectors", "swapped vectors"],
)
def test_a_damaged_chroma_is_found_and_rebuilt_from_the_record(built, damage) -> None:
    settings, queries, before = built
    damage(settings.chroma_path)
    report = check_store(settings.data_dir, settings.chroma_path)
    assert not report.consistent, report.to_dict()
    written = repair_store(settings.data_dir, settings.chroma_path, embed=None)  # the record has every vector
    assert written == SIZES
    assert check_store(settings.data_dir, settings.chroma_path).consistent
    store = ChunkStore.open(settings)
    after = {c: _top(store, c, queries) for c in SIZES}
    assert after == before
    assert census(settings.data_dir, "alpha", store).consistent()


def test_the_check_compares_chromas_ids_with_the_record_not_only_their_counts(built) -> None:
    settings, _, _ = built
    _swap_vectors(settings.chroma_path)
    (alpha,) = [c for c in check_store(settings.data_dir, settings.chroma_path).collections if c.name == "alpha"]
    assert alpha.chroma == alpha.catalog_chunks == SIZES["alpha"]  # the counts alone look right
    report = alpha.to_dict()
    assert (report["orphan_vectors"], report["missing_vectors"]) == (5, 5)
    assert alpha.orphans == [f"orphan:{i}" for i in range(5)]
    assert any("5 vectors of no indexed chunk" in p for p in alpha.problems)
    assert any("5 indexed chunks have no vector in Chroma" in p for p in alpha.problems)


def test_the_api_removes_orphan_vectors_when_it_starts(built) -> None:
    """Vectors of no indexed chunk (a write cut short) go at the next start; nothing indexed is touched."""
    from tests.chat_helpers import serve, without_backends

    settings, queries, before = built
    _add_orphans(settings.chroma_path)
    _forget_chroma()
    with serve(without_backends(data_dir=settings.data_dir)) as url:
        store = httpx.get(f"{url}/health", timeout=30).json()["backends"]["store"]
        assert not store.get("problems"), store
    _forget_chroma()
    report = check_store(settings.data_dir, settings.chroma_path)
    assert report.consistent, report.to_dict()
    assert [(c.name, c.orphans, c.chroma) for c in report.collections] == [(name, [], n) for name, n in SIZES.items()]
    assert {c: _top(ChunkStore.open(settings), c, queries) for c in SIZES} == before


def test_an_interrupted_repair_goes_on_where_it_stopped(built) -> None:
    settings, queries, before = built
    _delete_segment_folders(settings.chroma_path)
    calls = []

    def stop_midway(stage: str, done: int, total: int) -> None:
        calls.append((stage, done))
        if stage == "alpha: Chroma" and done >= 500:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repair_store(settings.data_dir, settings.chroma_path, progress=stop_midway)
    _forget_chroma()
    assert repair_store(settings.data_dir, settings.chroma_path) == SIZES
    store = ChunkStore.open(settings)
    assert {c: _top(store, c, queries) for c in SIZES} == before


def test_another_embedder_is_refused_with_the_reindex_command(built, tmp_path: Path) -> None:
    settings, _, _ = built
    pipeline = open_pipeline(settings, HashEmbedder(dim=32), paragraph_chunks)
    path = tmp_path / "new.txt"
    path.write_text("A new file.")
    with pytest.raises(EmbedderMismatch, match="rag store reindex --collection alpha"):
        asyncio.run(pipeline.run([SourceFile(path, str(path), path.name)], "alpha"))
    # The command it names re-embeds the collection from the record; then the new file goes in.
    other = HashEmbedder(dim=32)
    written = reindex_collection(
        settings.data_dir,
        settings.chroma_path,
        "alpha",
        model="other",
        embed=lambda texts: asyncio.run(other.embed(texts)),
    )
    assert written == SIZES and other.texts == SIZES["alpha"]
    _forget_chroma()
    pipeline = open_pipeline(settings, other, paragraph_chunks)
    assert asyncio.run(pipeline.run([SourceFile(path, str(path), path.name)], "alpha"))[0].status == "indexed"
    assert census(settings.data_dir, "alpha", pipeline.store).consistent()


# A store whose Chroma engine crashes when one collection is opened.


@dataclass(frozen=True)
class CrashingStore:
    data_dir: Path
    damaged: str  # the collection that crashes Chroma
    healthy: str  # one that still opens
    healthy_vectors: int


@pytest.fixture(scope="module")
def crashing_store_made_here(tmp_path_factory: pytest.TempPathFactory, embedding_server) -> Path:
    """A store written by the pipeline with the real embedder, then its `default` collection's HNSW files cut
    short: opening that collection kills Chroma's engine with a segfault, as in the store from the field."""
    from rag.clients.embedding import EmbeddingClient

    root = tmp_path_factory.mktemp("crashing")
    settings = Settings(data_dir=root / "data", embed_url=embedding_server.url, embed_batch=64)
    folder = root / "in"
    folder.mkdir()
    sources = []
    for i in range(32):  # default: 1,120 chunks (past the sync threshold: HNSW files on disk); other: 160
        path = folder / f"f{i}.txt"
        path.write_text("\n\n".join(f"File {i}, paragraph {j}: a note about topic {i}-{j}." for j in range(40)))
        sources.append(SourceFile(path, str(path), path.name))

    async def build() -> None:
        embedder = EmbeddingClient(settings.embed_url, model=settings.embed_model)
        pipeline = open_pipeline(settings, embedder, paragraph_chunks)
        try:
            await pipeline.run(sources[:28], "default")
            await pipeline.run(sources[28:], "other")
        finally:
            await embedder.aclose()
            pipeline.lexical.close()
            pipeline.catalog.close()
            pipeline.lease.release()

    asyncio.run(build())
    _forget_chroma()
    _truncate_hnsw(settings.chroma_path, "default")
    return settings.data_dir


@pytest.fixture(params=["made here", "from the field"])
def damaged_store(request: pytest.FixtureRequest, tmp_path: Path) -> CrashingStore:
    if request.param == "made here":
        shutil.copytree(request.getfixturevalue("crashing_store_made_here"), tmp_path / "store")
        return CrashingStore(tmp_path / "store", "default", "other", 160)
    if not FIELD_ARCHIVE:
        pytest.skip(
            f"set {FIELD_STORE}=/path/to/chroma-segfault-store.tar.zst (18 MB, a store damaged in the "
            "field, kept outside the repository) to run this test on it too"
        )
    if shutil.which("zstd") is None and shutil.which("unzstd") is None:
        pytest.skip("zstd is not installed: apt-get install zstd")
    subprocess.run(["tar", "--zstd", "-xf", FIELD_ARCHIVE, "-C", str(tmp_path)], check=True)
    return CrashingStore(tmp_path / "chroma-segfault-store", "default", "killtest", 2412)


@pytest.mark.integration
def test_a_store_that_crashes_chroma_is_probed_without_crashing(damaged_store: CrashingStore) -> None:
    probe = probe_chroma(damaged_store.data_dir / "chroma")
    # Found damaged, with Chroma's reason: the engine crashing (a signal), or reading its vectors back failing
    # (the probe reads a vector by its id before it would search with it).
    reason = probe.damaged.get(damaged_store.damaged, "")
    assert "signal" in reason or "Error getting embedding" in reason, probe
    assert probe.counts[damaged_store.healthy] == damaged_store.healthy_vectors


@pytest.mark.integration
def test_the_api_starts_on_a_store_that_crashes_chroma_and_reports_it(
    damaged_store: CrashingStore, ingest_settings: Settings
) -> None:
    settings = ingest_settings.model_copy(update={"data_dir": damaged_store.data_dir})
    with TestClient(
        __import__("rag.api.app", fromlist=["create_app"]).create_app(settings), base_url="http://127.0.0.1"
    ) as client:
        store = client.get("/health").json()["backends"]["store"]
        assert store["state"] == "damaged" and damaged_store.damaged in store["problems"]
        assert "rag store repair" in store["fix"]
        refused = client.post(
            "/v1/documents",
            data={"collection": damaged_store.damaged},
            files={"files": ("a.txt", b"Some words to index.")},
        )
        assert refused.status_code == 503 and "rag store repair" in refused.json()["error"]["message"]
        assert "retry-after" not in refused.headers  # it never clears by itself
        fine = client.post(
            "/v1/documents",
            data={"collection": damaged_store.healthy},
            files={"files": ("b.txt", b"Other words here.")},
        )
        assert fine.status_code == 200, fine.text


@pytest.mark.integration
@pytest.mark.timeout(
    2400
)  # the field's store: ~3 min idle; its 3,035 chunks embedded on a busy 2-core machine took 15 min
def test_rag_store_repair_restores_every_indexed_document(
    damaged_store: CrashingStore, embedding_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store made here takes every vector from the record; the field's is slow: its damaged collection's
    3,035 chunks predate the record's vectors and are embedded again."""
    from collections import Counter

    from click.testing import CliRunner

    from rag.cli import cli
    from rag.core.config import get_settings
    from rag.store.catalog import DocumentCatalog

    data_dir = damaged_store.data_dir
    monkeypatch.setenv("RAG_DATA_DIR", str(data_dir))
    monkeypatch.setenv("RAG_EMBED_URL", embedding_server.url)
    get_settings.cache_clear()
    try:
        assert CliRunner().invoke(cli, ["store", "check"]).exit_code == 1
        result = CliRunner().invoke(cli, ["store", "repair"])
        assert result.exit_code == 0, result.output
        check = CliRunner().invoke(cli, ["store", "check"])
        assert check.exit_code == 0 and "consistent" in check.output, check.output
        settings = get_settings()
    finally:
        get_settings.cache_clear()
    catalog = DocumentCatalog(data_dir / "catalog.sqlite")
    store = ChunkStore.open(settings)
    lexical = LexicalIndex(data_dir / "lexical.sqlite")
    try:
        for name in (damaged_store.damaged, damaged_store.healthy):
            held = Counter(m["doc_id"] for m in store.collection(name).get(include=["metadatas"])["metadatas"])
            assert held == Counter(catalog.indexed_chunks(name))  # every indexed document, every chunk
        # 50 questions: the rebuilt index's top 10 are the exact top 10 over the record's vectors (in
        # the same order, up to chunks whose scores tie within float32 rounding).
        rows = [r for batch in lexical.records(damaged_store.damaged) for r in batch]
        position = {r[0]: i for i, r in enumerate(rows)}
        matrix = np.asarray([r[4] for r in rows], dtype=np.float32)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)  # cosine space: Chroma normalizes too
        for i in range(0, 50 * (len(rows) // 50), len(rows) // 50):
            query = matrix[i] + 0.5 * matrix[(i * 7919) % len(rows)]
            query /= np.linalg.norm(query)
            scores = matrix @ query
            exact = np.sort(scores)[::-1][:10]
            found = [scores[position[h.id]] for h in store.query(damaged_store.damaged, query.tolist(), 10)]
            assert np.allclose(found, exact, atol=1e-5), (found, exact)
    finally:
        lexical.close()
        catalog.close()


@pytest.mark.integration
def test_repair_starts_its_own_embedding_server_when_none_answers(
    ingest_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks that lost their vectors with Chroma gone: nothing running, the repair embeds them itself."""
    from click.testing import CliRunner

    from rag.cli import cli
    from rag.clients.embedding import EmbeddingClient
    from rag.core.config import get_settings
    from tests.servers import free_port

    pipeline = open_pipeline(
        ingest_settings, EmbeddingClient(ingest_settings.embed_url, model=ingest_settings.embed_model)
    )
    path = tmp_path / "keeper.txt"
    path.write_text(
        "The lighthouse keeper lives on Skerry Island. She lights the lamp at dusk.\n\nSupplies come on Tuesdays."
    )
    assert asyncio.run(pipeline.run([SourceFile(path, str(path), path.name)], "default"))[0].status == "indexed"
    pipeline.lexical.close()
    pipeline.catalog.close()
    pipeline.lease.release()
    _forget_chroma()
    with sqlite3.connect(ingest_settings.data_dir / "lexical.sqlite") as db:
        db.execute("UPDATE chunks SET vector = NULL")  # as in a record written before it kept vectors
    shutil.rmtree(ingest_settings.chroma_path)

    monkeypatch.setenv("RAG_DATA_DIR", str(ingest_settings.data_dir))
    monkeypatch.setenv("RAG_EMBED_URL", f"http://127.0.0.1:{free_port()}")  # nothing answers there
    get_settings.cache_clear()
    try:
        check = CliRunner().invoke(cli, ["store", "check"])
        assert check.exit_code == 1 and "fix: run `rag store repair`" in check.output
        assert "stop the API" not in check.output  # the check holds the store: no API runs on it
        result = CliRunner().invoke(cli, ["store", "repair"])
        assert result.exit_code == 0, result.output
        assert "starting one for this run" in result.output and "vectors in Chroma" in result.output
        assert (ingest_settings.data_dir / "logs" / "store-repair-embedder.log").exists()
        after = CliRunner().invoke(cli, ["store", "check"])
        assert after.exit_code == 0 and "consistent" in after.output, after.output
    finally:
        get_settings.cache_clear()


@pytest.mark.integration
def test_store_check_while_the_api_holds_the_store_is_done_by_the_api(ingest_env: dict[str, str], tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The harbour of Gdańsk opened in 1890. " * 20)
    server = start_api(tmp_path, ingest_env, ready_path="/v1/collections")
    try:
        env = {**ingest_env, "RAG_API_HOST": "127.0.0.1", "RAG_API_PORT": server.url.rsplit(":", 1)[1]}
        sent = subprocess.run([sys.executable, "-m", "ingest.cli", str(docs)], env=env, capture_output=True, text=True)
        assert sent.returncode == 0, sent.stderr
        text = subprocess.run(
            [sys.executable, "-m", "rag.cli", "store", "check"], env=env, capture_output=True, text=True
        )
        assert text.returncode == 0, text.stderr
        assert f"(checked by the API at {server.url})" in text.stdout and text.stdout.rstrip().endswith("consistent")
        as_json = subprocess.run(
            [sys.executable, "-m", "rag.cli", "store", "check", "--json"], env=env, capture_output=True, text=True
        )
        (checked,) = json.loads(as_json.stdout)["collections"]
        assert checked["collection"] == "default" and checked["documents"] == 1
        assert checked["chroma"] == checked["catalog_chunks"] == checked["record_chunks"] > 0
    finally:
        server.stop()
    stopped = subprocess.run(
        [sys.executable, "-m", "rag.cli", "store", "check"], env=env, capture_output=True, text=True
    )
    assert stopped.returncode == 0 and "checked by the API" not in stopped.stdout  # the store is free: read here
