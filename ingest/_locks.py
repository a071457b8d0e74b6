"""The locks of a run: one per document, and the turns that give them out in file order."""

from __future__ import annotations

import asyncio
from typing import Any


class KeyedLocks:
    """One asyncio lock per key, kept only while someone holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[Any, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: Any) -> None:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._drop(key)
            raise

    def held(self, key: Any) -> bool:
        """Whether someone holds or awaits the lock of `key`."""
        return key in self._locks

    def release(self, key: Any) -> None:
        self._locks[key][0].release()
        self._drop(key)

    def _drop(self, key: Any) -> None:
        lock, users = self._locks[key]
        if users == 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)


class Turns:
    """Files opened at once take their document's lock in file order: the first of two copies of a file
    is the one indexed, the second is `unchanged`, whichever was read first."""

    def __init__(self) -> None:
        self._next = 0
        self._changed = asyncio.Condition()

    async def take(self, slot: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._next == slot)

    async def pass_on(self, slot: int) -> None:
        async with self._changed:
            self._next = slot + 1
            self._changed.notify_all()
