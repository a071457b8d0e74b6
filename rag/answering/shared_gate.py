"""One generation gate for every API replica of a database (RAG_DATABASE_URL): llama-server's slots
counted where every replica sees them, as PostgreSQL advisory locks.

Each replica keeps its own gate (`GenerationGate`: a FIFO in front of the slots, 429 past its length
or its wait) and, once admitted there, takes one of the `slots` cluster-wide locks
(`pg_try_advisory_lock(namespace, i)`) on a connection it holds for the generation. A replica that dies
drops its connections, and with them its slots: nothing to clean up, nothing leaked. N replicas never
put more than `slots` generations on llama-server; the rest wait up to RAG_QUEUE_TIMEOUT_S, then 429
with Retry-After.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rag.answering.gate import GenerationGate, Permit
from rag.core.errors import StoreUnavailable
from rag.store.postgres import Connection

_SLOT_LOCKS = 0x7261_6702  # the advisory-lock namespace of generation slots ("rag" 2)
_POLL_S = 0.05


class SharedPermit(Permit):
    """A local permit and the cluster slot (a lock on `conn`) it holds; release() gives back both."""

    def __init__(self, local: Permit, gate: SharedGenerationGate, conn: Connection, slot: int) -> None:
        self._local, self._shared, self._conn, self.slot = local, gate, conn, slot
        self.waited_s = local.waited_s
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._shared._give_back(self._conn, self.slot)
            self._local.release()


class SharedGenerationGate(GenerationGate):
    """`GenerationGate` whose slots are shared with every replica of the database at `url`."""

    def __init__(self, url: str, slots: int, queue_max: int, queue_timeout_s: float) -> None:
        super().__init__(slots, queue_max, queue_timeout_s)
        self.url = url
        self._idle: list[Connection] = []

    async def acquire(self) -> Permit:
        started = time.monotonic()
        local = await super().acquire()
        try:
            conn, slot = await self._cluster_slot(started + self.queue_timeout_s)
        except BaseException:
            local.release()
            raise
        permit = SharedPermit(local, self, conn, slot)
        permit.waited_s = time.monotonic() - started
        return permit

    async def _cluster_slot(self, deadline: float) -> tuple[Connection, int]:
        conn = self._idle.pop() if self._idle else await asyncio.to_thread(Connection, self.url, "gate")
        try:
            while True:
                slot = await asyncio.to_thread(self._try, conn)
                if slot is not None:
                    return conn, slot
                if time.monotonic() >= deadline:
                    raise self._busy(f"all {self.slots} generation slots of the replicas are busy")
                await asyncio.sleep(_POLL_S)
        except BaseException:
            self._idle.append(conn)
            raise

    def _try(self, conn: Connection) -> int | None:
        """The first free slot, now locked by `conn`; None when every one is taken."""
        for slot in range(self.slots):
            if conn.execute("SELECT pg_try_advisory_lock(?, ?)", (_SLOT_LOCKS, slot)).fetchone() == (True,):
                return slot
        return None

    def _give_back(self, conn: Connection, slot: int) -> None:
        try:
            conn.execute("SELECT pg_advisory_unlock(?, ?)", (_SLOT_LOCKS, slot))
        except StoreUnavailable:
            conn.close()  # the lock went with the broken connection
            return
        self._idle.append(conn)

    def holders(self) -> list[Any]:
        """The cluster's slots in use now (for /metrics and tests)."""
        conn = self._idle[-1] if self._idle else Connection(self.url, "gate")
        try:
            rows = conn.execute(
                "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = ?::oid AND objsubid = 2 "
                "AND granted ORDER BY objid",
                (_SLOT_LOCKS,),
            ).fetchall()
        finally:
            if conn not in self._idle:
                conn.close()
        return [int(r[0]) for r in rows]
