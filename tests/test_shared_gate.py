"""The generation gate shared by replicas through PostgreSQL: never more generations than slots across
replicas, the rest 429 with Retry-After, and a dead replica's slots freed with its connections."""

from __future__ import annotations

import asyncio

import pytest

from rag.answering.shared_gate import SharedGenerationGate
from rag.core.errors import Busy


def test_replicas_share_the_slots_and_the_rest_are_told_to_retry(database_url: str) -> None:
    async def run() -> None:
        one, two = (SharedGenerationGate(database_url, 2, queue_max=8, queue_timeout_s=0.3) for _ in range(2))
        first, second = await one.acquire(), await two.acquire()
        assert sorted(one.holders()) == [0, 1]
        with pytest.raises(Busy) as refused:
            await two.acquire()
        assert refused.value.retry_after >= 1 and two.active == 1  # its local admission given back
        first.release()
        third = await two.acquire()  # the freed slot, taken from the other replica
        assert sorted(one.holders()) == [0, 1]
        second.release()
        third.release()
        assert one.holders() == []

    asyncio.run(run())


def test_a_waiting_generation_gets_the_slot_another_replica_frees(database_url: str) -> None:
    async def run() -> None:
        one, two = (SharedGenerationGate(database_url, 1, queue_max=8, queue_timeout_s=5) for _ in range(2))
        held = await one.acquire()
        waiting = asyncio.ensure_future(two.acquire())
        await asyncio.sleep(0.3)
        assert not waiting.done()
        held.release()
        permit = await asyncio.wait_for(waiting, 5)
        assert permit.waited_s >= 0.2
        permit.release()

    asyncio.run(run())


def test_the_slots_of_a_dead_replica_are_free(database_url: str) -> None:
    async def run() -> None:
        dead, alive = (SharedGenerationGate(database_url, 1, queue_max=8, queue_timeout_s=5) for _ in range(2))
        permit = await dead.acquire()
        permit._conn.close()  # type: ignore[attr-defined]  # as the replica's death closes its connections
        taken = await asyncio.wait_for(alive.acquire(), 5)
        taken.release()

    asyncio.run(run())
