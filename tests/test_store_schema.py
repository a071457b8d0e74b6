"""Versioned store files: a store written before the files carried a version is opened, migrated (after
a copy of each file beside it) and queried; a file newer than the code is refused with both versions;
a step that fails leaves the file at the version before it."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from pathlib import Path

import pytest

from rag.core.errors import StoreTooNew
from rag.store.catalog import DocumentCatalog
from rag.store.chroma_vectors import ChunkStore, persistent_client
from rag.store.chunk_record import LexicalIndex
from rag.store.repair import check_store, repair_store
from rag.store.schema import LATEST, migrate, user_version

V0_STORE = Path(__file__).parent / "data" / "store-v0"
FIRST_RECORD_STORE = Path(__file__).parent / "data" / "store-first-record"


@pytest.fixture
def v0_store(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(V0_STORE, data)
    return data


def test_a_store_from_before_versions_is_migrated_and_answers(v0_store: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert user_version(v0_store / "lexical.sqlite") == user_version(v0_store / "catalog.sqlite") == 0
    with caplog.at_level(logging.INFO, logger="rag.store.schema"):
        catalog = DocumentCatalog(v0_store / "catalog.sqlite")
        lexical = LexicalIndex(v0_store / "lexical.sqlite")
    try:
        assert [r.name for r in catalog.list("default")] == ["lighthouse.txt"]
        assert catalog.indexed_chunks("garden") and sum(catalog.indexed_chunks("garden").values()) == 2
        texts = {cid: text for batch in lexical.records("default") for cid, _, text, _, _ in batch}
        hits = lexical.search("default", "whale oil lamp", 3)
        assert "whale oil" in texts[hits[0].chunk_id]
        assert lexical.search("garden", "Bramley apples", 1)[0].doc_id == catalog.list("garden")[0].doc_id
        assert lexical.embedder("default") is not None
    finally:
        lexical.close()
        catalog.close()
    for name in ("catalog.sqlite", "lexical.sqlite"):
        assert user_version(v0_store / name) == LATEST[name] == 1
        assert user_version(v0_store / f"{name}.v0.bak") == 0  # the file as it was, beside it
        assert f"{name}: schema 0 -> 1" in caplog.text


def test_a_store_from_the_first_record_is_migrated_rebuilt_and_searched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIRST_RECORD_STORE, data)
    assert user_version(data / "lexical.sqlite") == user_version(data / "catalog.sqlite") == 0
    assert repair_store(data, data / "chroma") == {"default": 1, "river": 1}  # the stored vectors alone
    report = check_store(data, data / "chroma")
    assert report.consistent, report.to_dict()
    assert {c.name: (c.documents, c.record_vectors) for c in report.collections} == {
        "default": (1, 1),
        "river": (1, 1),
    }
    for name in ("catalog.sqlite", "lexical.sqlite"):
        assert user_version(data / name) == LATEST[name]
        assert user_version(data / f"{name}.v0.bak") == 0

    lexical = LexicalIndex(data / "lexical.sqlite")
    store = ChunkStore(persistent_client(data / "chroma"), "default")
    try:
        identity = lexical.embedder("river")
        assert identity is not None and identity.model == "all-MiniLM-L6-v2" and identity.dimensions == 384
        [hit] = lexical.search("river", "tide mill ebb", 1)
        [(_, _, text, meta, vector)] = [row for batch in lexical.records("river") for row in batch]
        assert "tide mill" in text and meta["source"] == "mill.txt" and len(vector) == 384
        # The mill's own stored vector finds the mill in the rebuilt Chroma.
        assert store.query("river", [float(x) for x in vector], 1)[0].id == hit.chunk_id
        beacon = lexical.search("default", "whale oil beacon", 1)[0].chunk_id
        assert "whale oil" in lexical.chunks("default", [beacon])[beacon][0]
    finally:
        lexical.close()


def test_a_new_store_starts_at_the_latest_version_without_a_copy(
    tmp_path: Path,
) -> None:
    DocumentCatalog(tmp_path / "catalog.sqlite").close()
    LexicalIndex(tmp_path / "lexical.sqlite").close()
    assert user_version(tmp_path / "catalog.sqlite") == user_version(tmp_path / "lexical.sqlite") == 1
    assert not list(tmp_path.glob("*.bak"))


def test_a_store_newer_than_the_code_is_refused_with_both_versions(
    v0_store: Path,
) -> None:
    db = sqlite3.connect(str(v0_store / "lexical.sqlite"))
    db.execute("PRAGMA user_version = 7")
    db.close()
    with pytest.raises(StoreTooNew) as refused:
        LexicalIndex(v0_store / "lexical.sqlite")
    assert "schema version 7" in refused.value.message and "(1)" in refused.value.message
    assert user_version(v0_store / "lexical.sqlite") == 7


def test_a_failing_step_leaves_the_file_at_the_version_before_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.sqlite"
    db = sqlite3.connect(str(path), isolation_level=None)

    def broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half (x)")
        raise RuntimeError("step 2 failed")

    steps = [
        ("a table", lambda db: db.execute("CREATE TABLE a (x)")),
        ("a half table", broken),
    ]
    with pytest.raises(RuntimeError):
        migrate(db, path, steps)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["a"]
    db.close()
