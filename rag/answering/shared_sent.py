"""What each conversation's last prompt sent (rag.answering.continuation), shared by every API replica of
a database (RAG_DATABASE_URL): a follow-up that the balancer sends to another replica than its first turn
still finds the previous prompt's sources, so its prompt extends that one and llama-server reuses the prefix.

A row per conversation key (the questions so far: the same key every replica computes), written after
each packed prompt and read before the next one's sources are ordered. It is a hint: when the database
does not answer, the replica's own memory serves. Rows older than a day go.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence

from rag.answering.continuation import MAX_CONVERSATIONS, Ordered, Sent, SentSources
from rag.answering.query import Hit
from rag.core.errors import StoreUnavailable
from rag.store.postgres import Connection, PgStep, migrate, run_script

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sent_sources (
    key  TEXT PRIMARY KEY,
    sent TEXT NOT NULL,
    at   DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp())
)
"""
STEPS: list[PgStep] = [("the sources each conversation's last prompt sent", lambda db: run_script(db, _SCHEMA))]
KEEP_S = 86400.0  # a conversation idle for a day starts afresh
PRUNE_EVERY = 256  # writes between two removals of old rows


class SharedSentSources(SentSources):
    """`SentSources` kept in PostgreSQL at `url` as well as in this process."""

    def __init__(self, url: str, size: int = MAX_CONVERSATIONS) -> None:
        super().__init__(size)
        self._db = Connection(url, "conversations")
        migrate(self._db, "conversations", STEPS)
        self._lock = threading.Lock()  # one connection, used from worker threads
        self._writes = 0

    async def recall(self, key: str | None, hits: Sequence[Hit]) -> Ordered:
        if key is not None:
            try:
                found = await asyncio.to_thread(self._read, key)
            except StoreUnavailable as exc:
                log.info("sources of the previous prompt: this replica's own memory (%s)", exc.message)
            else:
                if found is not None:
                    self.remember(key, found)
        return self.order(key, hits)

    async def keep(self, key: str, sent: Sequence[Sent]) -> None:
        self.remember(key, sent)
        try:
            await asyncio.to_thread(self._write, key, list(sent))
        except StoreUnavailable as exc:
            log.info("sources of this prompt kept by this replica alone (%s)", exc.message)

    def _read(self, key: str) -> list[Sent] | None:
        with self._lock:
            row = self._db.execute("SELECT sent FROM sent_sources WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return [Sent(str(chunk_id), None if cut is None else int(cut)) for chunk_id, cut in json.loads(row[0])]

    def _write(self, key: str, sent: list[Sent]) -> None:
        payload = json.dumps([[s.chunk_id, s.cut_chars] for s in sent])
        with self._lock:
            self._db.execute(
                "INSERT INTO sent_sources (key, sent) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                "SET sent = excluded.sent, at = extract(epoch FROM clock_timestamp())",
                (key, payload),
            )
            self._writes += 1
            if self._writes % PRUNE_EVERY == 0:
                self._db.execute(
                    "DELETE FROM sent_sources WHERE at < extract(epoch FROM clock_timestamp()) - ?", (KEEP_S,)
                )
