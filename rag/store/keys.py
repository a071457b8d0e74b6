"""Scoped API keys, kept hashed in `keys.sqlite` in the data dir (versioned like the other SQLite files).

A key reads `rag_<id>_<secret>`: the id (8 hex digits) finds its row, the secret is 32 random bytes from
`secrets` (256 bits, URL-safe base64). Only the secret's SHA-256 is stored. A salt and a slow hash
(bcrypt, argon2) exist for passwords, which people choose from a small space an attacker can enumerate;
a secret drawn uniformly from 2^256 values cannot be enumerated at any hashing speed, and no table can be
precomputed for it, so one unsalted SHA-256 is as strong as the secret itself, and it costs a microsecond
a request. A leaked file gives neither the keys nor a way to test guesses faster than the API would.

A presented key is checked in constant time against its row's hash, or against a stand-in row's when no
row has its id, so a wrong secret and an unknown id take the same work and give the same answer.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rag.core.errors import InvalidRequest, NotFound, StoreDamaged, StoreUnavailable
from rag.store.schema import Step, migrate, run_script
from rag.store.sqlite import BUSY_TIMEOUT_S, write_transaction

FILE = "keys.sqlite"
TOKEN = re.compile(r"rag_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")
TOUCH_EVERY_S = 60.0  # `last used` is written at most this often per key: a read stays a read

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id          TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    collections TEXT,
    read_only   INTEGER NOT NULL,
    created_at  REAL NOT NULL,
    last_used   REAL
)
"""
_STEPS: list[Step] = [("scoped API keys", lambda db: run_script(db, _SCHEMA))]
# Compared against when no row has the presented id, so that case costs what a wrong secret costs.
_STAND_IN = hashlib.sha256(b"no such key").hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """What a key opens: its collections (None: every one) and whether it may only read."""

    id: str
    collections: tuple[str, ...] | None
    read_only: bool
    created_at: float
    last_used: float | None = None


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _row(row: tuple[str, str | None, int, float, float | None]) -> ApiKey:
    collections = tuple(json.loads(row[1])) if row[1] is not None else None
    return ApiKey(row[0], collections, bool(row[2]), row[3], row[4])


class KeyStore:
    """The key table; opened on first use, so an API whose data dir has no key file creates none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._opened: tuple[int, int] | None = None  # the (device, inode) of the file `_db` has open
        self._lock = threading.Lock()

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _open(self, create: bool) -> sqlite3.Connection | None:
        if self._db is not None and self._identity() != self._opened:
            # The file was moved away or replaced (a damaged one set aside and the keys made anew): its
            # keys go with it. The old connection is dropped, not closed: a thread may still be using it.
            self._db = None
        if self._db is None:
            if not create and not self.path.exists():
                return None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                migrate(db, self.path, _STEPS)
            except sqlite3.DatabaseError as exc:  # not SQLite at all, or not ours
                db.close()
                raise StoreDamaged(
                    f"{self.path} is not a key file ({exc}): move it away and create the keys again"
                ) from None
            except BaseException:
                db.close()
                raise
            self._db, self._opened = db, self._identity()
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def create(self, collections: list[str] | None, *, read_only: bool) -> tuple[ApiKey, str]:
        """A new key: its row and the token, which is shown once and stored only as a hash."""
        if collections is not None and not collections:
            raise InvalidRequest("a key needs at least one collection (or none named: every collection)")
        db = self._open(create=True)
        assert db is not None
        secret = secrets.token_urlsafe(32)
        stored = json.dumps(list(dict.fromkeys(collections))) if collections is not None else None
        with write_transaction(db, self._lock):
            while True:
                key_id = secrets.token_hex(4)
                if db.execute("SELECT 1 FROM api_keys WHERE id = ?", (key_id,)).fetchone() is None:
                    break
            created = time.time()
            db.execute(
                "INSERT INTO api_keys (id, secret_hash, collections, read_only, created_at) VALUES (?, ?, ?, ?, ?)",
                (key_id, _hash(secret), stored, int(read_only), created),
            )
        scope = tuple(json.loads(stored)) if stored is not None else None
        return ApiKey(key_id, scope, read_only, created), f"rag_{key_id}_{secret}"

    def list(self) -> list[ApiKey]:
        db = self._open(create=False)
        if db is None:
            return []
        with self._lock:
            rows = db.execute(
                "SELECT id, collections, read_only, created_at, last_used FROM api_keys ORDER BY created_at"
            ).fetchall()
        return [_row(r) for r in rows]

    def revoke(self, key_id: str) -> None:
        db = self._open(create=False)
        if db is not None:
            with write_transaction(db, self._lock):
                if db.execute("DELETE FROM api_keys WHERE id = ?", (key_id,)).rowcount:
                    return
        raise NotFound(f"no key {key_id[:40]!r} (rag keys list shows them)")

    def find(self, token: str) -> ApiKey | None:
        """The key `token` is, or None: a token of another shape, an unknown id and a wrong secret alike."""
        match = TOKEN.fullmatch(token)
        if match is None:
            return None
        key_id, secret = match.groups()
        db = self._open(create=False)
        row = ("", None, 0, 0.0, None, _STAND_IN)
        if db is not None:
            with self._lock:
                # One row either way, the key's or the stand-in: an unknown id reads as much as a known one.
                row = db.execute(
                    "SELECT id, collections, read_only, created_at, last_used, secret_hash FROM api_keys WHERE id = ? "
                    "UNION ALL SELECT '', NULL, 0, 0.0, NULL, ? LIMIT 1",
                    (key_id, _STAND_IN),
                ).fetchone()
        if not hmac.compare_digest(_hash(secret), row[5]) or row[0] != key_id:
            return None
        return _row(row[:5])

    def due_for_touch(self, key: ApiKey, now: float) -> bool:
        return key.last_used is None or now - key.last_used >= TOUCH_EVERY_S

    def touch(self, key_id: str, now: float) -> None:
        """Record that the key was used (best effort: a key file busy for the moment keeps its older time)."""
        db = self._open(create=False)
        if db is None:
            return
        try:
            with write_transaction(db, self._lock):
                db.execute("UPDATE api_keys SET last_used = ? WHERE id = ?", (now, key_id))
        except StoreUnavailable:
            return  # `last used` is a hint for the operator; a request is never refused over it
