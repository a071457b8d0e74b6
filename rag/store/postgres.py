"""The store's PostgreSQL backend (`RAG_DATABASE_URL=postgresql://...`): the connection every part shares,
its schema versions, and the owner lease held as an advisory lock.

The SQLite modules (`catalog`, `keys`) speak SQLite's dialect through one connection with `?` marks
and explicit `BEGIN IMMEDIATE ... COMMIT`; `Connection` takes the same calls, so their SQL serves both
backends. `BEGIN IMMEDIATE` becomes a transaction that first takes a transaction-level advisory lock
named for the part (catalog, record, keys): writers of one part take turns, as SQLite's one writer
does, so the read-then-write transactions (a claim reads the row it then replaces) stay correct under
PostgreSQL's READ COMMITTED.

A broken connection (PostgreSQL restarted, the network cut) is a 503 with Retry-After for the request
that met it; the next call connects again, so replicas recover without a restart.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urlparse

import psycopg

from rag.core.errors import EmbedderMismatch, LeaseLost, StoreTooNew, StoreUnavailable

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
KEEP_S = 1.0  # how often an owner lease checks its lock's connection (and takes the lock again after a restart)
_OWNER_LOCKS = 0x7261_6701  # the advisory-lock namespace of owner leases ("rag" 1)
_MARK = re.compile(r"\?")


def lock_key(name: str) -> int:
    """A stable 32-bit advisory-lock key for a name (the part a transaction writes)."""
    return zlib.crc32(name.encode()) & 0x7FFF_FFFF


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    parsed = urlparse(url)
    if parsed.password:
        netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
        return parsed._replace(netloc=netloc).geturl()
    return url


def connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit connection; StoreUnavailable naming the URL when the server is not there."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise StoreUnavailable(f"PostgreSQL at RAG_DATABASE_URL={shown_url(url)} is unreachable: {first}") from exc


class _Cursor:
    """What the SQLite code reads from a cursor: rows, a row count, the id of an insert."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        batch, self._rows = self._rows[:size], self._rows[size:]
        return batch

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)


class Connection:
    """One PostgreSQL connection that takes the SQLite module's calls (`?` marks, BEGIN IMMEDIATE), opened
    again after it broke. `part` names the advisory lock its write transactions take."""

    def __init__(
        self, url: str, part: str, on_connect: Callable[[psycopg.Connection[Any]], None] | None = None
    ) -> None:
        self.url = url
        self._key = lock_key(part)
        self._lock = threading.RLock()
        self._on_connect = on_connect
        self._in_transaction = False
        self._conn: psycopg.Connection[Any] | None = None
        self._live()

    def _live(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = connect(self.url)
            if self._on_connect is not None:
                self._on_connect(conn)
            self._conn = conn
        return self._conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        if sql.strip().upper() == "BEGIN IMMEDIATE":
            self._run("BEGIN", ())
            return self._run("SELECT pg_advisory_xact_lock(%s)", (self._key,))
        if params:
            sql = _MARK.sub("%s", sql.replace("%", "%%"))
        return self._run(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> _Cursor:
        count = 0
        for row in rows:
            count += self.execute(sql, row).rowcount
        return _Cursor([], count)

    def _run(self, sql: str, params: Sequence[Any]) -> _Cursor:
        with self._lock:
            # A connection that broke while idle (the server restarted) is found out by its next statement:
            # outside a transaction that statement is sent once more on a new connection.
            for attempt in (1, 2):
                conn = self._live()
                try:
                    cursor = conn.execute(sql, tuple(params) or None)
                    rows = cursor.fetchall() if cursor.description else []
                    break
                except psycopg.OperationalError as exc:
                    if not (conn.broken or conn.closed):
                        raise
                    self._conn = None
                    if self._in_transaction or attempt == 2:
                        self._in_transaction = False
                        raise StoreUnavailable(
                            f"PostgreSQL ({shown_url(self.url)}) went away: {str(exc).strip()[:200]}"
                        ) from exc
            word = sql.lstrip()[:8].upper()
            if word.startswith("BEGIN"):
                self._in_transaction = True
            elif word.startswith(("COMMIT", "ROLLBACK")):
                self._in_transaction = False
            return _Cursor(rows, cursor.rowcount)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# Schema versions: one row per part in `schema_versions`, moved forward step by step, each step in
# the transaction that records its number; a database newer than the code is refused with both.

PgStep = tuple[str, Callable[[Connection], None]]  # (what it does, the step)


def run_script(db: Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def from_sqlite(script: str) -> str:
    """A SQLite module's DDL in PostgreSQL's types (REAL is 4 bytes there: timestamps need 8)."""
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", re.sub(r"\bBLOB\b", "BYTEA", script))


def migrate(db: Connection, part: str, steps: list[PgStep]) -> None:
    """Bring `part`'s tables to version len(steps), or refuse a database whose version is newer."""
    latest = len(steps)
    db.execute("CREATE TABLE IF NOT EXISTS schema_versions (part TEXT PRIMARY KEY, version INTEGER NOT NULL)")
    for version in range(latest + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT version FROM schema_versions WHERE part = ?", (part,)).fetchone()
            have = int(row[0]) if row else 0
            if have > latest:
                raise StoreTooNew(
                    f"the PostgreSQL database at {shown_url(db.url)} has {part} schema version {have}, newer than "
                    f"this version of rag-stack reads ({latest}): upgrade rag-stack on every replica"
                )
            if have >= latest or have > version:
                db.execute("COMMIT")
                if have >= latest:
                    return
                continue
            what, step = steps[have]
            step(db)
            db.execute(
                "INSERT INTO schema_versions (part, version) VALUES (?, ?) "
                "ON CONFLICT (part) DO UPDATE SET version = excluded.version",
                (part, have + 1),
            )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        log.info("PostgreSQL %s schema %d -> %d: %s", part, have, have + 1, what)


def require_pgvector(db: Connection) -> None:
    """Create the `vector` extension, or say plainly that the server lacks it."""
    available = db.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    if available is None:
        raise StoreUnavailable(
            f"the PostgreSQL server at {shown_url(db.url)} has no pgvector extension ('vector'): install pgvector "
            "there (Debian: postgresql-NN-pgvector), or use Chroma (RAG_VECTOR_STORE=chroma)"
        )
    db.execute("CREATE EXTENSION IF NOT EXISTS vector")


# The owner lease: which rows a running process works on. Held as a session-level advisory lock on the
# process's own connection, so it ends with the process however it ends (kill -9 closes the socket).

_OWNERS = """
CREATE TABLE IF NOT EXISTS owners (
    id    SERIAL PRIMARY KEY,
    token TEXT UNIQUE NOT NULL,
    since DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM now())
)
"""
_OWNERS_EMBEDDER = "ALTER TABLE owners ADD COLUMN IF NOT EXISTS embedder TEXT"  # the model a replica embeds with
# The owners whose process is alive: it holds its advisory lock (PgOwnerLease) in this database (owner
# ids start at 1 in every database of a server).
_LIVE_LOCKS = (
    f"FROM owners o JOIN pg_locks l ON l.objid = o.id::oid WHERE l.locktype = 'advisory' "
    f"AND l.classid = {_OWNER_LOCKS}::oid AND l.objsubid = 2 AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
_LIVE_OWNERS = f"SELECT o.token, o.embedder {_LIVE_LOCKS}"
LIVE_TOKENS = f"SELECT o.token {_LIVE_LOCKS}"  # a subquery: the tokens of the live owners


def owners_table(db: Connection) -> None:
    """The owners table, which LIVE_TOKENS reads."""
    db.execute(_OWNERS)
    db.execute(_OWNERS_EMBEDDER)


def refuse_other_embedders(url: str, embedder: str) -> None:
    """Raise EmbedderMismatch naming both models when a live replica on this database embeds with another
    model than `embedder`: one collection would get vectors of two models."""
    db = Connection(url, "owners")
    try:
        owners_table(db)
        live = db.execute(_LIVE_OWNERS).fetchall()
    finally:
        db.close()
    others = sorted({model for _, model in live if model and model != embedder})
    if others:
        raise EmbedderMismatch(
            f"a running replica on the PostgreSQL database at {shown_url(url)} embeds with {', '.join(others)}, "
            f"this one with {embedder}: give every replica the same RAG_EMBED_MODEL (stop the others to change it)"
        )


class PgOwnerLease:
    """`OwnerLease` (rag/store/_lease.py) on PostgreSQL: the same calls, live while the lock is held.

    A PostgreSQL restart ends the lock's session, and with it the lease: other processes then see this one as
    gone. A keeper thread checks the lock's connection every `keep_s` and takes the lock again as soon as the
    server answers. Should it find the lock held by another session, or this owner's row gone (another process
    cleared it as a dead one's), the lease is lost for good (`lost` says why, logged once): `keep()` and
    `check()` raise LeaseLost, so this process claims no more rows and its job worker stops.
    """

    def __init__(self, url: str, embedder: str | None = None, keep_s: float = KEEP_S) -> None:
        self.url = url
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.lost: str | None = None
        self._released = threading.Event()
        self._db = Connection(url, "owners")
        owners_table(self._db)
        (row,) = self._db.execute(
            "INSERT INTO owners (token, embedder) VALUES (?, ?) RETURNING id", (self.token, embedder)
        ).fetchall()
        self._id = int(row[0])
        # Taken on every (re)connection: a PostgreSQL restart drops the lock, the keeper takes it again.
        self._held = Connection(url, "owners", on_connect=self._take)
        self._keeper = threading.Thread(target=self._keep_held, args=(keep_s,), name="owner-lease", daemon=True)
        self._keeper.start()

    def _take(self, conn: psycopg.Connection[Any]) -> None:
        """Take the lock on a new connection of the lease, or close it and raise LeaseLost."""
        try:
            if self.lost is not None or self._released.is_set():
                raise LeaseLost(self.lost or "the owner lease was released")
            (granted,) = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (_OWNER_LOCKS, self._id)).fetchone() or (
                False,
            )
            if not granted:
                self._lose("another process holds it")
            if (
                conn.execute("SELECT 1 FROM owners WHERE id = %s AND token = %s", (self._id, self.token)).fetchone()
                is None
            ):
                self._lose("its row in `owners` is gone (another process cleared it as a dead process's)")
        except BaseException:
            conn.close()  # the lock, if taken, goes with it
            raise

    def _lose(self, why: str) -> None:
        self.lost = (
            f"the owner lease {self.token} could not be taken again after PostgreSQL came back: {why}; "
            "this process works on no more documents or upload jobs under it (restart it)"
        )
        log.error("%s", self.lost)
        raise LeaseLost(self.lost)

    def _keep_held(self, every_s: float) -> None:
        while not self._released.wait(every_s):
            try:
                self.keep()
            except LeaseLost:
                return
            except StoreUnavailable:
                continue  # the server is away: tried again at the next tick

    def keep(self) -> None:
        """Check the lease's connection; a broken one is opened again and the lock taken again (LeaseLost
        when it cannot be)."""
        self.check()
        self._held.execute("SELECT 1")

    def check(self) -> None:
        """Raise LeaseLost when the lease is lost: rows must not be claimed under it."""
        if self.lost is not None:
            raise LeaseLost(self.lost)

    def is_live(self, token: str | None) -> bool:
        if token is None:
            return False
        if token == self.token:
            return True
        return self._db.execute(f"{_LIVE_OWNERS} AND o.token = ?", (token,)).fetchone() is not None

    def held_elsewhere(self, token: str | None) -> bool:
        return token != self.token and self.is_live(token)

    def forget(self, token: str) -> None:
        if token != self.token:
            self._db.execute("DELETE FROM owners WHERE token = ?", (token,))

    def release(self) -> None:
        self._released.set()  # before the close: the keeper takes the lock on no new connection
        try:
            self._db.execute("DELETE FROM owners WHERE token = ?", (self.token,))
        except StoreUnavailable:
            pass  # the server is away: the lock went with the connection
        self._held.close()
        self._db.close()
        self._keeper.join(timeout=CONNECT_TIMEOUT_S + 1)


def live_owners(url: str) -> int:
    """How many processes (API replicas, `ingest`) hold an owner lease on the database at `url`."""
    db = Connection(url, "owners")
    try:
        row = db.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = ?::oid AND objsubid = 2 "
            "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (_OWNER_LOCKS,),
        ).fetchone()
    finally:
        db.close()
    return int(row[0]) if row else 0
