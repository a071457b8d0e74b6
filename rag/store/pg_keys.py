"""Scoped API keys in PostgreSQL: `KeyStore`'s rows and checks, one table every replica reads."""

from __future__ import annotations

import sqlite3
import threading

from rag.store import keys
from rag.store.keys import KeyStore
from rag.store.postgres import Connection, PgStep, from_sqlite, migrate, run_script

STEPS: list[PgStep] = [("scoped API keys", lambda db: run_script(db, from_sqlite(keys._SCHEMA)))]


class PgKeyStore(KeyStore):
    """The key table in the shared database (made on first use, as the key file is)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = None  # type: ignore[assignment]  # no file
        self._pg: Connection | None = None
        self._lock = threading.Lock()

    def _open(self, create: bool) -> sqlite3.Connection | None:
        if self._pg is None:
            pg = Connection(self.url, "keys")
            migrate(pg, "keys", STEPS)
            self._pg = pg
        return self._pg  # type: ignore[return-value]  # takes the calls KeyStore makes

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
            self._pg = None
