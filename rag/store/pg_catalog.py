"""The document catalog in PostgreSQL: `DocumentCatalog`'s rows, states and transactions, shared by replicas.

The catalog's SQL is portable; what differs is the connection (`rag.store.postgres.Connection`, whose
write transactions take turns on an advisory lock, as SQLite's one writer does) and the column types.
"""

from __future__ import annotations

import builtins
import threading

from rag.store import catalog
from rag.store.catalog import DocumentCatalog, DocumentRecord, IsLive
from rag.store.postgres import Connection, PgStep, from_sqlite, migrate, run_script

STEPS: list[PgStep] = [("documents and their names", lambda db: run_script(db, from_sqlite(catalog._SCHEMA)))]


class PgDocumentCatalog(DocumentCatalog):
    """The catalog's rows in PostgreSQL; safe for threads and for any number of replicas."""

    def __init__(self, url: str) -> None:  # not super().__init__: it opens a SQLite file
        self.path = None  # type: ignore[assignment]  # no file: the database holds it
        db = Connection(url, "catalog")
        migrate(db, "catalog", STEPS)
        self._db = db  # type: ignore[assignment]  # takes the sqlite3 calls the catalog makes
        self._lock = threading.Lock()

    def leftovers(self, is_live: IsLive) -> builtins.list[DocumentRecord]:
        """Deleting rows whose owner is gone. A pending row of a stopped replica is not one: its upload is a
        job in the database that another replica runs again, and that run's claim takes the row over (a
        start-up clean-up beside it would delete the chunks that run writes)."""
        return [r for r in super().leftovers(is_live) if r.state == "deleting"]
