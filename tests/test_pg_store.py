"""The store's PostgreSQL backend against a real PostgreSQL 18: the catalog, the chunk record with each
replica's BM25 index following it, the keys, the owner lease, schema versions and bad URLs."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import psycopg
import pytest

from rag.core.config import Settings
from rag.core.errors import EmbedderMismatch, StoreTooNew, StoreUnavailable
from rag.store import pg_lexical
from rag.store.backend import open_catalog, open_keys, open_lease, open_lexical
from rag.store.chunk_record import LexicalIndex
from rag.store.pg_catalog import PgDocumentCatalog
from rag.store.pg_lexical import LOCAL_DIR, PgLexicalIndex
from rag.store.postgres import Connection, PgOwnerLease, migrate, refuse_other_embedders, require_pgvector

ROWS = [
    ("k1", "d1", "The tower was founded in 1887 by Gustave Eiffel.", ""),
    ("k2", "d1", "Rivers flow to the sea; the river Seine runs through Paris.", "Paris"),
    ("k3", "d2", "埃菲尔铁塔位于巴黎，建于一八八七年。", ""),
    ("k4", "d2", "A tower of the old town walls, rebuilt after the flood.", ""),
]
QUERIES = ["who founded the tower in Paris?", "埃菲尔铁塔在哪里", "river flood", "walls"]


def test_the_default_is_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.database_url is None
    catalog, lexical = open_catalog(settings), open_lexical(settings)
    assert isinstance(lexical, LexicalIndex) and catalog.path == tmp_path / "catalog.sqlite"
    catalog.close()
    lexical.close()


def test_a_database_url_must_be_postgresql() -> None:
    with pytest.raises(ValueError, match="not a postgresql:// URL"):
        Settings(database_url="mysql://db/rag")


def test_a_connection_lost_inside_a_transaction_is_a_503(database_url: str) -> None:
    db = Connection(database_url, "t")
    db.execute("BEGIN")
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    with pytest.raises(StoreUnavailable) as caught:  # its first statements are gone: not sent again
        db.execute("SELECT 1")
    assert caught.value.status == 503 and caught.value.retry_after
    assert db.execute("SELECT 1").fetchone() == (1,)


def test_an_unreachable_database_is_one_line_naming_it(tmp_path: Path) -> None:
    url = f"postgresql://rag:secret@/rag?host={tmp_path}"
    with pytest.raises(StoreUnavailable) as caught:
        PgDocumentCatalog(url)
    message = caught.value.message
    assert "RAG_DATABASE_URL=postgresql://rag:***@/rag" in message and "secret" not in message
    assert "\n" not in message


def test_bm25_scores_are_tantivys(database_url: str, tmp_path: Path) -> None:
    pg, tantivy = PgLexicalIndex(database_url, tmp_path / "replica"), LexicalIndex(tmp_path / "lexical.sqlite")
    for index in (pg, tantivy):
        index.add("c1", ROWS)
        index.add("c2", [("k9", "d9", "another tower elsewhere", "")])
    for query in QUERIES:
        ours = [(h.chunk_id, round(h.score, 4)) for h in pg.search("c1", query, 5)]
        assert ours == [(h.chunk_id, round(h.score, 4)) for h in tantivy.search("c1", query, 5)], query
        assert ours
    assert pg.idf(["tower", "absent"]) == pytest.approx(tantivy.idf(["tower", "absent"]))
    assert pg.held("c1", ["tower", "elsewher", "absent"]) == tantivy.held("c1", ["tower", "elsewher", "absent"])
    assert pg.held("c1", ["tower", "elsewher", "absent"]) == {"tower"}
    assert [h.chunk_id for h in pg.search("c1", "tower", 5, doc_ids=["d2"])] == ["k4"]


def test_the_record_and_its_search_index_change_together(database_url: str, tmp_path: Path) -> None:
    index = PgLexicalIndex(database_url, tmp_path / "replica")
    index.add("c1", [(*row, {"doc_id": row[1]}, [0.5, 0.5]) for row in ROWS])
    index.add("c1", [("k1", "d1", "The tower was painted red.", "")])  # re-adding replaces
    assert index.total() == 4 and index.search_count() == 4
    assert index.document_counts("c1") == {"d1": (2, 1), "d2": (2, 2)}
    assert index.chunks("c1", ["k1"])["k1"][0] == "The tower was painted red."
    assert [r[0] for batch in index.records("c1", batch=3) for r in batch] == ["k2", "k3", "k4", "k1"]
    assert index.delete_document("c1", "d2") == 2
    assert index.search("c1", "埃菲尔铁塔", 5) == []
    assert index.search_counts("c1", ["d1", "d2"]) == {"d1": 2, "d2": 0}
    assert index.delete_collection("c1") == 2 and index.total() == 0 and index.search("c1", "tower", 5) == []


def test_a_chunk_written_through_one_replica_is_found_through_another(database_url: str, tmp_path: Path) -> None:
    one, other = PgLexicalIndex(database_url, tmp_path / "one"), PgLexicalIndex(database_url, tmp_path / "two")
    one.add("c1", ROWS)
    assert [h.chunk_id for h in other.search("c1", "who founded the tower?", 5)] == ["k1", "k4"]
    assert [h.chunk_id for h in other.search("c1", "埃菲尔铁塔", 5)] == ["k3"]
    one.add("c1", [("k1", "d1", "A lighthouse painted red.", "")])  # re-adding replaces
    assert [h.chunk_id for h in other.search("c1", "lighthouse", 5)] == ["k1"]
    assert [h.chunk_id for h in other.search("c1", "founded", 5)] == []
    assert one.delete_document("c1", "d2") == 2
    assert other.search("c1", "埃菲尔铁塔", 5) == [] and other.search("c1", "walls", 5) == []
    assert other.search_count() == 2 and other.search_counts("c1", ["d1", "d2"]) == {"d1": 2, "d2": 0}
    one.delete_collection("c1")
    assert other.search("c1", "lighthouse", 5) == [] and other.search_count() == 0


def test_replicas_sharing_a_data_dir_share_its_index(database_url: str, tmp_path: Path) -> None:
    one, other = PgLexicalIndex(database_url, tmp_path / LOCAL_DIR), PgLexicalIndex(database_url, tmp_path / LOCAL_DIR)
    one.add("c1", ROWS)
    assert [h.chunk_id for h in other.search("c1", "walls", 5)] == ["k4"]  # applied by `other`, for both
    assert [h.chunk_id for h in one.search("c1", "walls", 5)] == ["k4"]
    assert one.search_count() == other.search_count() == 4


def test_a_replica_whose_index_is_deleted_rebuilds_it(database_url: str, tmp_path: Path) -> None:
    writer = PgLexicalIndex(database_url, tmp_path / "writer")
    writer.add("c1", ROWS)
    reader = PgLexicalIndex(database_url, tmp_path / "reader")
    assert reader.search_count() == 4
    reader.close()
    shutil.rmtree(tmp_path / "reader")  # the replica's data dir lost its index
    writer.delete_document("c1", "d2")
    again = PgLexicalIndex(database_url, tmp_path / "reader")
    assert again.search_count() == 2 and [h.chunk_id for h in again.search("c1", "tower", 5)] == ["k1"]


def test_a_replica_behind_the_pruned_log_rebuilds_its_index(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_lexical, "KEEP_CHANGES", 2)
    monkeypatch.setattr(pg_lexical, "_PRUNE_EVERY_S", 0.0)
    writer, behind = PgLexicalIndex(database_url, tmp_path / "writer"), PgLexicalIndex(database_url, tmp_path / "b")
    writer.add("c1", ROWS[:2])
    assert behind.search_count() == 2
    behind.close()  # stopped while the others write on
    writer.delete_document("c1", "d1")
    writer.add("c1", ROWS[2:])
    with psycopg.connect(database_url) as conn:  # the log kept only its last 2 entries
        assert conn.execute("SELECT count(*) FROM lexical_changes").fetchone() == (2,)
    again = PgLexicalIndex(database_url, tmp_path / "b")
    assert again.search_count() == 2 and [h.chunk_id for h in again.search("c1", "tower", 5)] == ["k4"]
    assert again.search("c1", "river", 5) == []


def test_a_record_of_schema_1_is_upgraded_and_its_term_table_dropped(database_url: str, tmp_path: Path) -> None:
    db = Connection(database_url, "record")
    migrate(db, "record", pg_lexical.STEPS[:1])  # the record as version 1 left it: BM25 terms in a table
    db.execute(
        "INSERT INTO chunks (collection, chunk_id, doc_id, text, length) VALUES ('c1', 'k1', 'd1', ?, 9)", (ROWS[0][2],)
    )
    db.execute("INSERT INTO lexical_terms SELECT 'tower', 'c1', id, 'd1', 1, 9 FROM chunks")
    index = PgLexicalIndex(database_url, tmp_path / "replica")
    assert db.execute("SELECT version FROM schema_versions WHERE part = 'record'").fetchone() == (2,)
    assert db.execute("SELECT to_regclass('lexical_terms'), to_regclass('lexical_stats')").fetchone() == (None, None)
    assert [h.chunk_id for h in index.search("c1", "who founded the tower?", 5)] == ["k1"]
    index.add("c1", [ROWS[1]])  # and written on as version 2
    assert [h.chunk_id for h in index.search("c1", "river", 5)] == ["k2"] and index.total() == 2


def test_catalog_states_and_names(database_url: str) -> None:
    catalog, lease = PgDocumentCatalog(database_url), PgOwnerLease(database_url)
    assert (
        catalog.claim("c1", "d1", source="a.txt", name="a.txt", size=3, owner=lease.token, is_live=lease.is_live)[0]
        == "claimed"
    )
    assert (
        catalog.claim("c1", "d1", source="a.txt", name="a.txt", size=3, owner="x", is_live=lease.is_live)[0] == "busy"
    )
    catalog.mark_indexed("c1", "d1", chunks=2, pages=None, owner=lease.token)
    catalog.add_name("c1", "d1", source="b.txt", name="b.txt")
    catalog.add_name("c1", "d1", source="b.txt", name="B.txt")
    assert catalog.names_of("c1", ["d1"]) == {"d1": [("a.txt", "a.txt"), ("b.txt", "B.txt")]}
    assert catalog.counts()["c1"].documents == 1 and catalog.indexed_chunks("c1") == {"d1": 2}
    assert (
        catalog.claim("c1", "d1", source="a.txt", name="a.txt", size=3, owner="x", is_live=lease.is_live)[0]
        == "indexed"
    )


def test_an_owner_is_live_while_its_connection_lasts(database_url: str) -> None:
    mine, other = PgOwnerLease(database_url), PgOwnerLease(database_url)
    assert mine.is_live(other.token) and mine.held_elsewhere(other.token) and not mine.held_elsewhere(mine.token)
    other._released.set()  # its keeper thread ends with its process
    other._held.close()  # as kill -9 of its process would close it
    deadline = time.monotonic() + 5  # the server's backend notices the closed socket within milliseconds
    while mine.is_live(other.token) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not mine.is_live(other.token)
    assert isinstance(open_lease(Settings(database_url=database_url)), PgOwnerLease)


def test_a_replica_embedding_with_another_model_than_a_running_one_is_refused(database_url: str) -> None:
    running = PgOwnerLease(database_url, "all-MiniLM-L6-v2")
    refuse_other_embedders(database_url, "all-MiniLM-L6-v2")  # the same model: welcome
    with pytest.raises(EmbedderMismatch) as caught:
        refuse_other_embedders(database_url, "multilingual-e5-small")
    assert "embeds with all-MiniLM-L6-v2, this one with multilingual-e5-small" in caught.value.message
    running.release()  # every replica stopped: the next may change the model
    refuse_other_embedders(database_url, "multilingual-e5-small")


def test_serve_api_refuses_another_embedder_than_its_replicas_in_one_line(
    database_url: str, isolated_env: Path
) -> None:
    import os
    import subprocess
    import sys

    running = PgOwnerLease(database_url, "all-MiniLM-L6-v2")
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "RAG_EMBED_MODEL": "multilingual-e5-small"}
    started = subprocess.run(
        [sys.executable, "-m", "rag.cli", "serve-api"], env=env, capture_output=True, text=True, timeout=120
    )
    running.release()
    assert started.returncode != 0
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1 and "give every replica the same RAG_EMBED_MODEL" in lines[0], started.stderr


def test_a_pending_row_of_a_stopped_replica_is_left_to_its_job(database_url: str) -> None:
    catalog, lease = PgDocumentCatalog(database_url), PgOwnerLease(database_url)
    for doc_id, state in (("d1", "pending"), ("d2", "deleting")):
        catalog.claim("c1", doc_id, source=doc_id, name=doc_id, size=1, owner="gone-1", is_live=lease.is_live)
        if state == "deleting":
            catalog.mark_deleting("c1", doc_id, owner="gone-1", is_live=lease.is_live)
    assert [r.doc_id for r in catalog.leftovers(lease.is_live)] == ["d2"]


def test_keys_live_in_the_database(database_url: str) -> None:
    keys = open_keys(Settings(database_url=database_url))
    key, token = keys.create(["c1"], read_only=True)
    again = open_keys(Settings(database_url=database_url))  # another replica
    assert again.find(token) == key and again.find(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    again.revoke(key.id)
    assert keys.find(token) is None


def test_a_database_newer_than_the_code_is_refused_with_both_versions(database_url: str) -> None:
    PgDocumentCatalog(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE schema_versions SET version = 7 WHERE part = 'catalog'")
    with pytest.raises(
        StoreTooNew, match=r"catalog schema version 7, newer than this version of rag-stack reads \(1\)"
    ):
        PgDocumentCatalog(database_url)


def test_pgvector_is_there_or_named(database_url: str) -> None:
    db = Connection(database_url, "vectors")
    require_pgvector(db)
    assert db.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone() == ("0.8.5",)
    db.execute("ALTER SYSTEM RESET ALL")  # nothing changed; the missing case is the message's text
    with pytest.raises(StoreUnavailable, match=r"no pgvector extension \('vector'\)"):
        require_pgvector(_without_vector(db))


class _without_vector:
    """A connection whose server lists no `vector` extension (the Debian package's PostgreSQL)."""

    def __init__(self, db: Connection) -> None:
        self.url = db.url

    def execute(self, sql: str, params: object = ()) -> object:
        class Empty:
            def fetchone(self) -> None:
                return None

        return Empty()


def test_a_connection_lost_while_idle_is_opened_again(database_url: str, tmp_path: Path) -> None:
    catalog, lexical = PgDocumentCatalog(database_url), PgLexicalIndex(database_url, tmp_path / "replica")
    lexical.add("c1", ROWS)
    with psycopg.connect(database_url, autocommit=True) as admin:  # what a PostgreSQL restart does to clients
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    assert catalog.counts() == {}  # sent again on a new connection, no restart of the process
    assert [h.chunk_id for h in lexical.search("c1", "tower", 5)] == ["k1", "k4"]


def test_a_sqlite_store_migrated_to_postgresql_ranks_the_same(database_url: str, isolated_env: Path) -> None:
    from click.testing import CliRunner

    from rag.cli import cli
    from rag.store.catalog import DocumentCatalog
    from rag.store.keys import KeyStore
    from rag.store.record import EmbedderIdentity

    catalog, lexical = DocumentCatalog(isolated_env / "catalog.sqlite"), LexicalIndex(isolated_env / "lexical.sqlite")
    for doc_id in ("d1", "d2"):
        catalog.claim("c1", doc_id, source=f"{doc_id}.txt", name=doc_id, size=9, owner="o", is_live=lambda _: False)
        catalog.mark_indexed("c1", doc_id, chunks=2, pages=None, owner="o")
    catalog.add_name("c1", "d1", source="copy.txt", name="copy")
    lexical.add("c1", [(*row, {"doc_id": row[1]}, [0.6, 0.8]) for row in ROWS])
    lexical.set_embedder("c1", EmbedderIdentity.of("all-MiniLM-L6-v2", ROWS[0][2], [0.6, 0.8]))
    _, token = KeyStore(isolated_env / "keys.sqlite").create(["c1"], read_only=True)

    result = CliRunner().invoke(cli, ["store", "migrate", "--to", database_url])
    assert result.exit_code == 0, result.output
    assert "copied 2 documents, 4 chunks in 1 collections and 1 keys" in result.output

    pg_catalog, pg_lexical = PgDocumentCatalog(database_url), PgLexicalIndex(database_url, isolated_env / LOCAL_DIR)
    assert pg_catalog.documents("c1") == catalog.documents("c1")
    assert pg_catalog.names_of("c1", ["d1"]) == catalog.names_of("c1", ["d1"])
    for query in QUERIES:
        assert [(h.chunk_id, round(h.score, 4)) for h in pg_lexical.search("c1", query, 10)] == [
            (h.chunk_id, round(h.score, 4)) for h in lexical.search("c1", query, 10)
        ]
    assert list(pg_lexical.records("c1")) == list(lexical.records("c1"))
    assert pg_lexical.embedder("c1") == lexical.embedder("c1")
    assert open_keys(Settings(database_url=database_url)).find(token) is not None
    again = CliRunner().invoke(cli, ["store", "migrate", "--to", database_url])
    assert again.exit_code == 1 and "holds a store already" in str(again.exception)  # refused, nothing copied


def test_the_embedded_postgresql_takes_its_shared_buffers_once() -> None:
    import tempfile

    from rag.deploy.replicas import embedded_postgres

    directory = Path(tempfile.mkdtemp(prefix="rag-pg-buffers-"))  # PostgreSQL's own user reads it (as root)
    directory.chmod(0o755)
    try:
        for _ in range(2):  # set and restarted, then found set
            url, stop = embedded_postgres(directory / "pgdata", "256MB")
            try:
                with psycopg.connect(url) as conn:
                    assert conn.execute("SHOW shared_buffers").fetchone() == ("256MB",)
            finally:
                stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
