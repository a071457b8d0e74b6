"""The chunk store on pgvector (`RAG_VECTOR_STORE=pgvector`) against a real PostgreSQL 18 with pgvector
0.8.5: the same answers as the Chroma store for the same calls, the API's upload, search and delete on
it, `rag store check` and `rag store repair` finding and putting back a lost vector (and filling an
emptied store by a bulk load, its HNSW index built once after), and the same top 10 after the database
restarts."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest
from click.testing import CliRunner

from rag.cli import cli
from rag.core.config import Settings
from rag.core.errors import NotFound, StoreUnavailable, UpstreamError
from rag.store import pg_vectors
from rag.store.backend import open_vectors
from rag.store.chroma_vectors import ChunkStore, persistent_client
from rag.store.pg_vectors import PgVectorStore
from rag.store.vectors import VectorStore
from tests.chat_helpers import changed, serve, upload

DOCS = {
    "lighthouse.txt": "The lighthouse keeper lit the lamp at dusk; its beam swept the granite quay and the ferry.",
    "bakery.txt": "The bakery on Mill Street bakes rye bread before dawn and sells it warm to the fishermen.",
    "orchard.txt": "Apple trees in the orchard blossom in April; the cider press runs through October.",
}


def _vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Unit vectors in clusters (as chunks of a few topics are), float32."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(n // 50, 1), dim))
    points = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.normal(size=(n, dim))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def _fill(store: VectorStore, collection: str, vectors: np.ndarray, per_doc: int = 10) -> list[str]:
    ids = [f"doc{i // per_doc}:{i % per_doc}" for i in range(len(vectors))]
    metadatas = [
        {"doc_id": f"doc{i // per_doc}", "chunk_index": i % per_doc, "source": "a.txt"} for i in range(len(ids))
    ]
    store.upsert(collection, ids, vectors, [f"chunk {i}" for i in range(len(ids))], metadatas)
    return ids


def _top(store: VectorStore, collection: str, queries: np.ndarray, k: int = 10, **kw: Any) -> list[list[str]]:
    return [[h.id for h in store.query(collection, q.tolist(), k, **kw)] for q in queries]


@pytest.fixture
def stores(database_url: str, tmp_path: Path) -> tuple[ChunkStore, PgVectorStore]:
    return ChunkStore(persistent_client(tmp_path / "chroma")), PgVectorStore(database_url)


def test_chroma_stays_the_default_and_pgvector_needs_postgresql(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.vector_store == "chroma" and isinstance(open_vectors(settings), ChunkStore)
    with pytest.raises(ValueError, match="vector_store=pgvector keeps the vectors in PostgreSQL: set RAG_DATABASE_URL"):
        Settings(data_dir=tmp_path, vector_store="pgvector")


def _exact(
    ids: list[str], vectors: np.ndarray, queries: np.ndarray, doc_ids: list[str] | None = None
) -> list[list[str]]:
    """The true top 10 of every query by cosine (the vectors are unit length), within some documents."""
    rows = [i for i, id_ in enumerate(ids) if doc_ids is None or id_.split(":")[0] in doc_ids]
    return [[ids[rows[j]] for j in np.argsort(-(vectors[rows] @ q), kind="stable")[:10]] for q in queries]


def _misses(found: list[list[str]], exact: list[list[str]]) -> list[int]:
    return [len(set(want) - set(got)) for got, want in zip(found, exact, strict=True)]


def test_pgvector_answers_as_chroma_does(stores: tuple[ChunkStore, PgVectorStore]) -> None:
    """The same 600 chunks in both: each finds the true top 10, in order, unfiltered and within some
    documents (both are HNSW indexes, approximate: Chroma builds its graph on several threads, so a
    run may miss one of the ten; neither misses more), the same scores, the same counts, texts and
    metadata, and the same after a document is deleted."""
    vectors, queries = _vectors(600, 32), _vectors(20, 32, seed=1)
    for store in stores:
        ids = _fill(store, "harbour", vectors)
    chroma, pg = stores
    for kw in ({}, {"doc_ids": ["doc3", "doc17", "doc40"]}, {"doc_ids": ["doc5"], "texts": False}):
        exact = _exact(ids, vectors, queries, kw.get("doc_ids"))  # type: ignore[arg-type]
        for store in stores:
            misses = _misses(_top(store, "harbour", queries, **kw), exact)
            assert max(misses) <= 1 and sum(misses) <= 2, (type(store).__name__, kw, misses)
        both = [q for q, (a, b) in enumerate(zip(_top(pg, "harbour", queries, **kw), exact, strict=True)) if a == b]
        assert len(both) >= 18, kw
    q = queries[0].tolist()
    scores = [{h.id: round(h.score, 5) for h in store.query("harbour", q, 10)} for store in stores]
    assert len(set(scores[0]) & set(scores[1])) >= 9
    assert all(scores[0][id_] == scores[1][id_] for id_ in set(scores[0]) & set(scores[1]))
    assert pg.get("harbour", ["doc2:3", "doc9:0", "nope:1"]) == chroma.get("harbour", ["doc2:3", "doc9:0", "nope:1"])
    assert pg.get("harbour", ["doc2:3"])[0].metadata == {"doc_id": "doc2", "chunk_index": 3, "source": "a.txt"}
    for store in stores:
        store.delete_document("harbour", "doc3")
        store.delete_ids("harbour", ["doc4:0", "doc4:1"])
    assert pg.count("harbour") == chroma.count("harbour") == 588
    assert pg.ids("harbour") == chroma.ids("harbour")
    assert pg.count_document("harbour", "doc4") == chroma.count_document("harbour", "doc4") == 8
    kept = [i for i, id_ in enumerate(ids) if not id_.startswith(("doc3:", "doc4:0", "doc4:1"))]
    exact = _exact([ids[i] for i in kept], vectors[kept], queries)
    for store in stores:
        assert max(_misses(_top(store, "harbour", queries), exact)) <= 1
    assert pg.names() == chroma.names() == ["harbour"]
    for store in stores:
        with pytest.raises(NotFound, match="no collection 'elsewhere'; the collections are: harbour"):
            store.query("elsewhere", q, 3)
        assert store.query("default", q, 3) == []  # the default collection before its first document
        store.delete_collection("harbour")
        assert not store.exists("harbour") and store.names() == []


@pytest.mark.parametrize("kind", ["chroma", "pgvector"])
def test_a_vector_of_another_width_is_one_clear_error_on_either_store(
    kind: str, stores: tuple[ChunkStore, PgVectorStore]
) -> None:
    store: VectorStore = stores[0] if kind == "chroma" else stores[1]
    _fill(store, "harbour", _vectors(20, 16))
    message = r"collection 'harbour' holds 16-dimensional vectors; got a 8-dimensional one: serve the embedder"
    with pytest.raises(UpstreamError, match=message) as caught:
        _fill(store, "harbour", _vectors(10, 8))
    assert caught.value.status == 502 and caught.value.detail == {"dimensions": 8, "expected": 16}
    with pytest.raises(UpstreamError, match=message):
        store.query("harbour", [0.1] * 8, 5)
    assert store.count("harbour") == 20


def test_a_restart_of_postgresql_keeps_the_top_10(postgres_server: Any, database_url: str) -> None:
    """2,000 chunks: every query's top 10, in order, is the same from a new store after PostgreSQL
    stopped and started again, and it is the exact top 10 (HNSW at ef_search 200 misses nothing here)."""
    vectors, queries = _vectors(2000, 64), _vectors(30, 64, seed=2)
    store = PgVectorStore(database_url)
    ids = _fill(store, "scale", vectors)
    before = _top(store, "scale", queries)
    exact = [[ids[i] for i in np.argsort(-(vectors @ q), kind="stable")[:10]] for q in queries]
    assert before == exact
    store.close()
    postgres_server._stop()
    postgres_server.ensure_postgres_running()
    assert _top(PgVectorStore(database_url), "scale", queries) == before


def _hnsw(url: str, collection: str) -> str | None:
    """The definition of a collection's HNSW index; None while it has none."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT indexdef FROM pg_indexes JOIN vector_collections c ON indexname = 'vectors_' || c.id || '_hnsw' "
            "WHERE c.name = %s",
            (collection,),
        ).fetchone()
    return None if row is None else str(row[0])


def test_a_load_into_an_empty_collection_builds_its_hnsw_index_once_after(database_url: str) -> None:
    """`loading` (a repair filling an empty store): the rows go in with no HNSW index, which is there after,
    with the parameters of a collection made by an upload, and every query's top 10 is the exact top 10;
    a load cut short still leaves the index, and a load into a collection that holds rows keeps it. The
    vectors are stored as they were sent."""
    vectors, queries = _vectors(2000, 64), _vectors(30, 64, seed=2)
    store = PgVectorStore(database_url)
    _fill(store, "uploaded", vectors[:10])
    made_by_upload = _hnsw(database_url, "uploaded")
    assert made_by_upload is not None and "WITH (m='16', ef_construction='200')" in made_by_upload
    with store.loading("loaded"):
        ids = _fill(store, "loaded", vectors)
        assert _hnsw(database_url, "loaded") is None
    assert _hnsw(database_url, "loaded") == made_by_upload.replace("vectors_1", "vectors_2")
    exact = [[ids[i] for i in np.argsort(-(vectors @ q), kind="stable")[:10]] for q in queries]
    assert _top(store, "loaded", queries) == exact
    held = store.vectors_of("loaded", ids[:50])  # sent in binary: the same float32s, bit for bit
    assert all(np.array_equal(held[i], vectors[n]) for n, i in enumerate(ids[:50]))

    with store.loading("uploaded"):  # holds rows: written through its index
        assert _hnsw(database_url, "uploaded") == made_by_upload
        _fill(store, "uploaded", vectors[10:20])  # the same ids, other vectors
    assert store.count("uploaded") == 10
    assert np.allclose(store.vectors_of("uploaded", ["doc0:0"])["doc0:0"], vectors[10])

    with pytest.raises(RuntimeError, match="cut short"), store.loading("cut"):
        _fill(store, "cut", vectors[:500])
        raise RuntimeError("cut short")
    assert _hnsw(database_url, "cut") is not None and store.count("cut") == 500
    with store.loading("cut"):  # non-empty: the index stays, the rows are upserted through it
        _fill(store, "cut", vectors[:600])
    assert store.count("cut") == 600 and _hnsw(database_url, "cut") is not None


@pytest.mark.parametrize("sized", [True, False])
def test_an_index_build_sizes_its_memory_to_the_graph_and_logs_when_it_does_not_fit(
    sized: bool, database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With the server's maintenance_work_mem at 1 MB, a load of 2,000 384-d vectors builds its graph in
    memory sized to it, and pgvector says nothing; kept at the server's 1 MB, the graph outgrows it and
    pgvector's notice is logged as a warning."""
    name = database_url.split("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET maintenance_work_mem = '1MB'")
    if not sized:
        monkeypatch.setattr(pg_vectors, "BUILD_MEMORY_MAX", 0)
    store = PgVectorStore(database_url)
    with caplog.at_level("WARNING", logger=pg_vectors.log.name), store.loading("big"):
        _fill(store, "big", _vectors(2000, 384))
    said = [r.getMessage() for r in caplog.records if "maintenance_work_mem" in r.getMessage()]
    assert (said == []) if sized else said[0].startswith("PostgreSQL: hnsw graph no longer fits"), said
    assert _hnsw(database_url, "big") is not None


def _at_once(calls: list[Any]) -> float:
    """Seconds for every call to end, each on a thread of its own, started together."""
    threads = [threading.Thread(target=call) for call in calls]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def test_concurrent_queries_search_at_once_on_readers_of_their_own(database_url: str) -> None:
    """Reads take a connection of the store's pool each: 4 reads of 0.4 s end together (about 0.4 s, not
    1.6 s, which one shared reader would take; a store of one reader takes that long), and 16 queries
    from 16 threads, half of them past ef_search (set on their own connection and put back), find what
    they find one at a time."""
    store = PgVectorStore(database_url, readers=4)
    vectors, queries = _vectors(1000, 32), _vectors(16, 32, seed=3)
    _fill(store, "harbour", vectors)
    assert _at_once([lambda: store._read("SELECT pg_sleep(0.4)") for _ in range(4)]) < 1.2

    def top(i: int) -> list[str]:
        return _top(store, "harbour", queries[i : i + 1], k=10 if i % 2 else 300)[0]

    alone = [top(i) for i in range(len(queries))]
    together: dict[int, list[str]] = {}
    _at_once([lambda i=i: together.__setitem__(i, top(i)) for i in range(len(queries))])
    assert [together[i] for i in range(len(queries))] == alone
    one = PgVectorStore(database_url, readers=1)
    assert _at_once([lambda: one._read("SELECT pg_sleep(0.2)") for _ in range(3)]) >= 0.6  # one after another


def _cli(args: list[str], env: dict[str, str]) -> Any:
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


@pytest.mark.parametrize("vectors", ["pgvector", "Chroma server"])
def test_upload_search_delete_check_and_repair_through_the_api_on_postgresql(
    vectors: str, backend_settings: Settings, database_url: str, request: pytest.FixtureRequest
) -> None:
    """The API on PostgreSQL with its vectors in pgvector (or a Chroma server): an upload is found, a
    deleted document is not; with the API stopped, a vector lost from the store is what `rag store check`
    reports, and `rag store repair` writes it again from the record."""
    env = {"RAG_DATABASE_URL": database_url, "RAG_DATA_DIR": str(backend_settings.data_dir)}
    if vectors == "pgvector":
        env["RAG_VECTOR_STORE"] = "pgvector"
    else:
        env.update(RAG_CHROMA_MODE="server", RAG_CHROMA_URL=request.getfixturevalue("chroma_server").url)
    settings = changed(backend_settings, **{k[4:].lower(): v for k, v in env.items()})
    with serve(settings) as url:
        results = upload(url, DOCS)["results"]
        doc_of = {r["filename"]: r["document_id"] for r in results}
        ask = {"messages": [{"role": "user", "content": "when does the bakery bake rye bread?"}], "stream": False}
        answer = httpx.post(f"{url}/v1/chat", json={**ask, "max_tokens": 1, "top_k": 2}, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["sources"][0]["doc_id"] == doc_of["bakery.txt"]
        health = httpx.get(f"{url}/health", timeout=30).json()["backends"]["store"]
        assert health["mode"] == ("pgvector" if vectors == "pgvector" else "server"), health
        gone = httpx.delete(f"{url}/v1/documents/{doc_of['bakery.txt']}", timeout=60)
        assert gone.status_code == 204
        answer = httpx.post(f"{url}/v1/chat", json={**ask, "max_tokens": 1, "top_k": 3}, timeout=120)
        assert doc_of["bakery.txt"] not in {s["doc_id"] for s in answer.json()["sources"]}
        report = httpx.get(f"{url}/v1/store/check", timeout=60).json()
        assert report["consistent"] and report["vector_store"] == vectors.split()[0], report
    store = open_vectors(settings)
    assert store.count("default") == sum(r["chunks"] for r in results if r["filename"] != "bakery.txt")
    assert not (settings.data_dir / "chroma").exists()  # nothing went to an embedded Chroma
    lost = sorted(store.ids("default"))[0]
    store.delete_ids("default", [lost])

    env["RAG_EMBED_URL"] = settings.embed_url
    checked = _cli(["store", "check", "--json"], env)
    assert checked.exit_code == 1
    (problem,) = json.loads(checked.output)["collections"][0]["problems"]
    assert problem == f"1 indexed chunks have no vector in {vectors.split()[0]} (such as {lost!r})"
    repaired = _cli(["store", "repair"], env)
    assert repaired.exit_code == 0, repaired.output
    assert "repaired in place" in repaired.output
    checked = _cli(["store", "check"], env)
    assert checked.exit_code == 0 and checked.output.rstrip().endswith("consistent"), checked.output
    assert lost in store.ids("default")

    held = store.ids("default")
    store.delete_collection("default")  # an empty store: the repair fills it by a bulk load
    repaired = _cli(["store", "repair"], env)
    assert repaired.exit_code == 0, repaired.output
    assert store.ids("default") == held and _cli(["store", "check"], env).exit_code == 0
    if vectors == "pgvector":
        assert _hnsw(database_url, "default") is not None


def test_repair_is_refused_while_an_api_holds_the_database(backend_settings: Settings, database_url: str) -> None:
    settings = changed(backend_settings, database_url=database_url, vector_store="pgvector")
    env = {"RAG_DATA_DIR": str(settings.data_dir), "RAG_DATABASE_URL": database_url, "RAG_VECTOR_STORE": "pgvector"}
    with serve(settings) as url:
        upload(url, {"orchard.txt": DOCS["orchard.txt"]})
        refused = CliRunner().invoke(cli, ["store", "repair"], env=env)
        checked = _cli(["store", "check"], env)  # a check reads beside it
    assert isinstance(refused.exception, StoreUnavailable), refused.output
    assert "(an API replica or `ingest`) work on this database: stop them" in refused.exception.message
    assert checked.exit_code == 0, checked.output
