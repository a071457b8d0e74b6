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
def busy_is_unavailable() -> Iterator[None]:
    """Another process's lock on the file, past the busy timeout, is a 503 with Retry-After, not a 500."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
        raise StoreUnavailable(
            f"the store's SQLite file is locked by another process ({exc}); try again shortly"
        ) from exc


def begin_immediate(db: sqlite3.Connection) -> None:
    """Take the write lock up front (reads inside the transaction are current); StoreUnavailable when held."""
    with busy_is_unavailable():
        db.execute("BEGIN IMMEDIATE")


@contextmanager
def write_transaction(db: sqlite3.Connection, lock: threading.Lock | threading.RLock) -> Iterator[sqlite3.Connection]:
    """One write transaction under the process's lock."""
    with lock:
        begin_immediate(db)
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
