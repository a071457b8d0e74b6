"""`rag store backup` and `rag store restore`: the record and the catalog taken at one moment, with a
manifest, and put back into an empty data dir with Chroma and BM25 rebuilt from the record.

One moment: the backup opens a write transaction (`BEGIN IMMEDIATE`) on both SQLite files, which makes
every other writer wait (the API's connections wait up to 30 s), then copies each file with SQLite's
online backup API through a second connection: readers are not blocked under WAL, and what they read is
the state both files had when the writers stopped. An upload being indexed at that moment is in the copy
as a `pending` document, which the next start removes, as after a crash. Chroma and the BM25 index are
derived and rebuilt on restore; `--with-indexes` copies them too, only while no process holds the store
(Chroma's files cannot be copied consistently under a running API).

The kept originals of the documents that have pages (the PDFs and images the page viewer renders: see
`ingest.originals`) are copied too, once the writers go on: an original never changes (its name is its
content's hash), so only a document deleted in between can lack its original in the copy, which the
manifest counts (`originals_missing`, as for documents indexed before originals were kept). The caller
says where an original lives (`original_of`), since that layout belongs to ingestion. Rendered pages
are a cache and are left out. Restored, the originals are back where they were, checked like every file.

Safe to kill: a backup is written into `.<DEST>.partial` beside DEST and renamed at the end; a
previous backup at DEST is moved to `.<DEST>.previous` first and removed once the new one is in place,
and put back when a killed run left DEST missing. A backup deletes only what it wrote: DEST must be
missing, empty or one of our backups (a manifest and only the files it lists), and outside the data
dir; anything else is refused before a file is touched. A restore writes `restore.json` into the data dir
first; run again, it goes on where it stopped (the copy, then the repair's resumable rebuild).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from rag.core.errors import BackupInvalid
from rag.core.provenance import package_version
from rag.store.schema import LATEST, user_version

FORMAT = 1
MANIFEST = "manifest.json"
RECORD_FILES = ("catalog.sqlite", "lexical.sqlite")
INDEX_DIRS = ("chroma", "lexical.tantivy")
ORIGINALS_DIR = "originals"
RESTORE_MARK = "restore.json"


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextmanager
def writers_held(data_dir: Path, timeout_s: float = 30.0) -> Iterator[None]:
    """Hold the write lock of both SQLite files: no writer commits until the block ends."""
    with ExitStack() as stack:
        for name in RECORD_FILES:
            db = sqlite3.connect(str(data_dir / name), isolation_level=None, timeout=timeout_s)
            stack.callback(db.close)
            db.execute("BEGIN IMMEDIATE")
            stack.callback(db.execute, "ROLLBACK")
        yield


def _copy_sqlite(source: Path, target: Path) -> None:
    src = sqlite3.connect(str(source))
    dst = sqlite3.connect(str(target))
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
    finally:
        dst.close()
        src.close()


def _collections(lexical: Path, catalog: Path) -> dict[str, Any]:
    """Per collection of the copy: documents, chunks, vectors and the embedder that made them."""
    out: dict[str, Any] = {}
    cat = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
    lex = sqlite3.connect(f"file:{lexical}?mode=ro", uri=True)
    try:
        for name, docs, chunks in cat.execute(
            "SELECT collection, COUNT(*), COALESCE(SUM(chunks), 0) FROM documents WHERE state = 'indexed' GROUP BY collection"
        ):
            out[name] = {"documents": docs, "chunks": chunks}
        for name, rows, vectors in lex.execute(
            "SELECT collection, COUNT(*), COUNT(vector) FROM chunks GROUP BY collection"
        ):
            out.setdefault(name, {"documents": 0, "chunks": 0}).update(record_chunks=rows, record_vectors=vectors)
        for name, model, dims, normalized in lex.execute(
            "SELECT collection, model, dimensions, normalized FROM embedders"
        ):
            out.setdefault(name, {"documents": 0, "chunks": 0})["embedder"] = {
                "model": model,
                "dimensions": dims,
                "normalized": bool(normalized),
            }
    finally:
        lex.close()
        cat.close()
    return out


def _fsync_tree(root: Path) -> None:
    for path in [*root.rglob("*"), root]:
        if path.is_file() or path.is_dir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _previous(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.previous")


def _partial(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.partial")


def _ours(folder: Path) -> bool:
    """`folder` is one of our backups, whole or not: a manifest of our format and no file it does not list."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        listed = set(manifest["files"]) | {MANIFEST} if manifest.get("format") == FORMAT else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return False
    return listed is not None and all(
        str(p.relative_to(folder)) in listed for p in folder.rglob("*") if not p.is_dir() or p.is_symlink()
    )


def _removable(folder: Path) -> bool:
    """Ours to delete: missing, an empty folder (no link), or one of our backups."""
    if not folder.exists() and not folder.is_symlink():
        return True
    return folder.is_dir() and not folder.is_symlink() and (not any(folder.iterdir()) or _ours(folder))


def check_destination(data_dir: Path, dest: Path) -> None:
    """Refuse a destination inside the data dir (or holding it) and one with files that are not our backup's."""
    store, target = data_dir.resolve(), dest.resolve()
    if target == store or target.is_relative_to(store) or store.is_relative_to(target):
        raise BackupInvalid(f"{dest} is inside the data dir {data_dir} (or holds it): back up to a folder outside it")
    for folder in (dest, _previous(dest)):
        if not _removable(folder):
            raise BackupInvalid(
                f"{folder} exists and is not a backup of rag-stack: a backup replaces only a previous one; "
                "choose a missing or empty folder"
            )
    partial = _partial(dest)
    if not (
        _removable(partial) or (partial.is_dir() and not partial.is_symlink() and (partial / _PARTIAL_MARK).exists())
    ):
        raise BackupInvalid(f"{partial} exists and was not left by a backup: move it away first")


_PARTIAL_MARK = ".rag-backup-partial"  # in a backup being written, until its manifest is


OriginalOf = Callable[[str, str], Path | None]  # (collection, doc_id) -> the kept original's file, if any


def _copy_originals(data_dir: Path, partial: Path, original_of: OriginalOf) -> int:
    """Copy the originals of the copy's indexed documents that have pages; how many are missing."""
    db = sqlite3.connect(f"file:{partial / 'catalog.sqlite'}?mode=ro", uri=True)
    try:
        paged = db.execute(
            "SELECT collection, doc_id FROM documents WHERE state = 'indexed' AND pages IS NOT NULL"
        ).fetchall()
    finally:
        db.close()
    missing = 0
    for collection, doc_id in paged:
        try:
            source = original_of(collection, doc_id)
        except ValueError:  # an id that is no content hash has none
            source = None
        if source is None:
            missing += 1
            continue
        target = partial / source.relative_to(data_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(source, target)
        except FileNotFoundError:  # deleted with its document since the record was copied
            target.unlink(missing_ok=True)
            missing += 1
    return missing


def backup_store(
    data_dir: Path, dest: Path, *, with_indexes: bool = False, original_of: OriginalOf | None = None
) -> dict[str, Any]:
    """Write a backup of the store at `data_dir` into `dest`; returns its manifest. The caller holds the
    store's lock when `with_indexes` (no process writes Chroma meanwhile). With `original_of`, the kept
    originals of documents with pages are in it too."""
    for name in RECORD_FILES:
        if not (data_dir / name).exists():
            raise BackupInvalid(f"no store to back up: {data_dir / name} does not exist")
    dest = dest.absolute()
    check_destination(data_dir, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists() and _previous(dest).exists():
        _previous(dest).rename(dest)  # a run killed between its two renames
    partial = _partial(dest)
    shutil.rmtree(partial, ignore_errors=True)  # a killed run's leftovers (checked: it holds our mark)
    partial.mkdir()
    (partial / _PARTIAL_MARK).touch()
    started = time.time()
    with writers_held(data_dir):
        taken_at = time.time()
        for name in RECORD_FILES:
            _copy_sqlite(data_dir / name, partial / name)
    missing = _copy_originals(data_dir, partial, original_of) if original_of is not None else None
    if with_indexes:
        for name in INDEX_DIRS:
            if (data_dir / name).exists():
                shutil.copytree(data_dir / name, partial / name)
    files = {
        str(p.relative_to(partial)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(partial.rglob("*"))
        if p.is_file() and p.name != _PARTIAL_MARK
    }
    manifest = {
        "format": FORMAT,
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(taken_at)),
        "source": str(data_dir),
        "rag_stack": package_version(),
        "sqlite": sqlite3.sqlite_version,
        "schema": {name: user_version(partial / name) for name in RECORD_FILES},
        "with_indexes": with_indexes,
        "collections": _collections(partial / "lexical.sqlite", partial / "catalog.sqlite"),
        "originals": sum(1 for name in files if name.startswith(f"{ORIGINALS_DIR}/")),
        "originals_missing": missing,
        "files": files,
        "seconds": round(time.time() - started, 3),
    }
    (partial / _PARTIAL_MARK).unlink()
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    _fsync_tree(partial)
    if dest.exists():
        shutil.rmtree(_previous(dest), ignore_errors=True)
        dest.rename(_previous(dest))
    partial.rename(dest)
    shutil.rmtree(_previous(dest), ignore_errors=True)
    return manifest


# Restore.


def read_manifest(src: Path, embed_model: str) -> dict[str, Any]:
    """The backup's manifest, once every file it lists is there with its checksum, every collection's
    embedder is `embed_model` and no schema is newer than this code's; else BackupInvalid with the reason."""
    path = src / MANIFEST
    if not path.is_file():
        raise BackupInvalid(f"{src} is not a backup: it has no {MANIFEST}")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except ValueError as exc:
        raise BackupInvalid(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise BackupInvalid(f"{path} has backup format {found!r}; this version reads {FORMAT}")
    try:
        _Manifest.model_validate(manifest)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise BackupInvalid(f"{path} is not a manifest this version reads ({where})") from None
    _check_files(src, manifest)
    _check_compatible(manifest, embed_model)
    return manifest


def _check_files(src: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is in the backup with its size and checksum; the record's files are listed."""
    for name in RECORD_FILES:
        if name not in manifest.get("files", {}):
            raise BackupInvalid(f"the backup's manifest lists no {name}")
    for name, want in manifest["files"].items():
        file = src / name
        _check_name(src, name)
        if not file.is_file():
            raise BackupInvalid(f"the backup lacks {name}, which its manifest lists")
        if file.stat().st_size != want["bytes"] or sha256(file) != want["sha256"]:
            raise BackupInvalid(
                f"{name} in the backup does not match its checksum in the manifest: the copy is damaged"
            )


class _File(BaseModel):
    bytes: int
    sha256: str


class _Collection(BaseModel):
    embedder: dict[str, Any] | None = None


class _Manifest(BaseModel):
    """The parts of a manifest a restore reads, with their types (the rest is information)."""

    taken_at: str
    files: dict[str, _File]
    schema_: dict[str, int] = Field(default_factory=dict, alias="schema")
    collections: dict[str, _Collection] = Field(default_factory=dict)


def _check_name(src: Path, name: str) -> None:
    """`name` is one of the store's files (a record file, or one inside an index folder or the originals), a plain file
    of the backup: no absolute path, no `..`, no symbolic link on the way, which would read or write
    outside the backup and the data dir."""
    parts = Path(name).parts
    inside = name in RECORD_FILES or (len(parts) > 1 and parts[0] in (*INDEX_DIRS, ORIGINALS_DIR))
    if Path(name).is_absolute() or ".." in parts or not inside:
        raise BackupInvalid(f"the backup's manifest lists {name[:200]!r}, which is no file of the store")
    for depth in range(1, len(parts) + 1):
        if src.joinpath(*parts[:depth]).is_symlink():
            raise BackupInvalid(f"{name[:200]} in the backup is a symbolic link: a backup holds plain files only")


def _check_compatible(manifest: dict[str, Any], embed_model: str) -> None:
    """No schema newer than this code's, and every collection embedded by `embed_model`."""
    for name, version in manifest.get("schema", {}).items():
        if name not in LATEST:
            raise BackupInvalid(f"the backup's manifest names a schema of {name[:80]!r}, which is no file of the store")
        if version > LATEST[name]:
            raise BackupInvalid(
                f"{name} in the backup has schema version {version}; this version of rag-stack reads up to {LATEST[name]}: upgrade it first"
            )
    for name, info in manifest.get("collections", {}).items():
        model = (info.get("embedder") or {}).get("model")
        if model is not None and model != embed_model:
            raise BackupInvalid(
                f"collection {name!r} in the backup was embedded with {model}, but RAG_EMBED_MODEL is {embed_model}: "
                f"set RAG_EMBED_MODEL={model} (and its RAG_EMBED_MODEL_PATH) to restore it"
            )


def store_contents(data_dir: Path) -> list[str]:
    """What a restore would replace in `data_dir`."""
    return [name for name in (*RECORD_FILES, *INDEX_DIRS, ORIGINALS_DIR) if (data_dir / name).exists()]


def restore_files(src: Path, data_dir: Path, manifest: dict[str, Any], *, force: bool = False) -> list[str]:
    """Put the backup's record and catalog (and its indexes and originals, if it has them) into `data_dir`. Refused
    when the data dir holds a store, unless `force` (the replaced files are moved into
    `replaced-<time>/` there) or this is the same restore run again. Returns what was replaced."""
    mark = data_dir / RESTORE_MARK
    data_dir.mkdir(parents=True, exist_ok=True)
    backup_id = _backup_id(manifest)
    ours = mark.exists() and json.loads(mark.read_text()).get("backup") == backup_id
    present = [] if ours else store_contents(data_dir)
    if present and not force:
        raise BackupInvalid(
            f"{data_dir} already holds a store ({', '.join(present)}); restore into an empty data dir, "
            "or pass --force to replace those (they are moved into replaced-<time>/ there)"
        )
    if present:
        aside = data_dir / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir()
        for name in present:
            (data_dir / name).rename(aside / name)
        for name in RECORD_FILES:
            for extra in (f"{name}-wal", f"{name}-shm"):
                if (data_dir / extra).exists():
                    (data_dir / extra).rename(aside / extra)
    mark.write_text(json.dumps({"backup": backup_id, "taken_at": manifest["taken_at"], "source": str(src)}) + "\n")
    for name in sorted(manifest["files"]):
        target = data_dir / name
        if ours and target.exists():
            continue  # copied by the interrupted run (a rename is the last step of each copy)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        shutil.copyfile(src / name, part)
        part.rename(target)
    return present


def _backup_id(manifest: dict[str, Any]) -> str:
    """What tells one backup from another in `restore.json`: the checksums of its files (`taken_at` has
    one-second steps: a killed restore of one backup must not be resumed by a restore of another)."""
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()


def finish_restore(data_dir: Path) -> None:
    (data_dir / RESTORE_MARK).unlink(missing_ok=True)
