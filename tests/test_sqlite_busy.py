"""Another process holding the catalog's write lock: a write is a 503 StoreUnavailable (with
Retry-After at the API) after a few seconds, never a 500 after half a minute."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rag.core.errors import StoreUnavailable
from rag.store.catalog import DocumentCatalog


def test_a_write_while_another_process_holds_the_lock_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    DocumentCatalog(path).close()
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
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        catalog = DocumentCatalog(path)  # opening needs no write lock
        with pytest.raises(StoreUnavailable, match="locked by another process") as info:
            catalog.claim("default", "d1", source="a.txt", name="a.txt", size=1, owner="me", is_live=lambda o: False)
        assert info.value.status == 503 and info.value.retry_after
    finally:
        holder.kill()
        holder.wait()
