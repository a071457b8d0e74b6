"""What the SQLite-backed parts of the store share: one write transaction under the process's lock."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def write_transaction(db: sqlite3.Connection, lock: threading.Lock | threading.RLock) -> Iterator[sqlite3.Connection]:
    """One write transaction; IMMEDIATE takes the write lock up front so reads inside it are current."""
    with lock:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
