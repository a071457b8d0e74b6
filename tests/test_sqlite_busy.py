"""Another process holding the write lock of the catalog or of the lexical record: a write is a 503
StoreUnavailable (with Retry-After at the API) after a few seconds, never a 500 after half a minute."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rag.core.errors import StoreUnavailable
from rag.store.catalog import DocumentCatalog
from rag.store.chunk_record import LexicalIndex


def _hold(path: Path) -> subprocess.Popen[str]:
    """A process holding `path`'s write lock until killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_write_while_another_process_holds_the_lock_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    DocumentCatalog(path).close()
    holder = _hold(path)
    try:
        catalog = DocumentCatalog(path)  # opening needs no write lock
        with pytest.raises(StoreUnavailable, match="locked by another process") as info:
            catalog.claim("default", "d1", source="a.txt", name="a.txt", size=1, owner="me", is_live=lambda o: False)
        assert info.value.status == 503 and info.value.retry_after
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    "write",
    [
        lambda lexical: lexical.add("default", [("d1:0", "d1", "a new chunk about owls")]),
        lambda lexical: lexical.delete_document("default", "d0"),
        lambda lexical: lexical.set_vectors("default", [("d0:0", [0.0] * 4, None)]),
    ],
    ids=["add", "delete", "vectors"],
)
def test_a_lexical_write_while_another_process_holds_its_lock_is_store_unavailable(tmp_path: Path, write) -> None:
    path = tmp_path / "lexical.sqlite"
    lexical = LexicalIndex(path)
    lexical.add("default", [("d0:0", "d0", "a chunk about larks")])
    holder = _hold(path)
    try:
        with pytest.raises(StoreUnavailable, match="locked by another process") as info:
            write(lexical)
        assert info.value.status == 503 and info.value.retry_after
    finally:
        holder.kill()
        holder.wait()
    assert [h.chunk_id for h in lexical.search("default", "larks", 5)] == ["d0:0"]  # nothing half-written
    lexical.close()
