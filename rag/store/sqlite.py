"""What the SQLite-backed parts of the store share: one write transaction under the process's lock."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rag.core.errors import StoreUnavailable

# How long a statement waits for another process's lock on the file before the request is a 503: a
# few seconds, so a client hears "try again" rather than hanging for half a minute.
BUSY_TIMEOUT_S = 5.0


@contextmanager
def write_transaction(db: sqlite3.Connection, lock: threading.Lock | threading.RLock) -> Iterator[sqlite3.Connection]:
    """One write transaction; IMMEDIATE takes the write lock up front so reads inside it are current."""
    with lock:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(
                f"the store's SQLite file is locked by another process ({exc}); try again shortly"
            ) from exc
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
