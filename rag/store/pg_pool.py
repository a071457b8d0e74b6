"""A small pool of PostgreSQL connections for the reads that many threads make at once (the dense
searches of concurrent queries on pgvector).

Our own and this small rather than psycopg-pool (not a dependency): it hands out `Connection`s, which
already take the SQLite modules' calls and open themselves again after PostgreSQL restarted; a pool of
plain psycopg connections would need that again around it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from rag.store.postgres import Connection


class ConnectionPool:
    """Up to `size` `Connection`s, opened as callers need them and kept: each caller has one to itself
    for its call, and a caller past `size` waits for one."""

    def __init__(
        self, url: str, part: str, size: int, on_connect: Callable[[psycopg.Connection[Any]], None] | None = None
    ) -> None:
        self.url, self.part, self.size = url, part, size
        self._on_connect = on_connect
        self._free = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection of the pool's for the caller alone."""
        with self._free:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = Connection(self.url, self.part, on_connect=self._on_connect)
            try:
                yield conn
            finally:
                self._give_back(conn)

    def _give_back(self, conn: Connection) -> None:
        with self._lock:
            kept = not self._closed
            if kept:
                self._idle.append(conn)
        if not kept:
            conn.close()

    def close(self) -> None:
        """Close the idle connections; those in use close when they come back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
