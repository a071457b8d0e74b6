"""Backpressure: at most one generation per llama-server slot, a short bounded queue, then 429.

llama-server itself queues requests for busy slots without bound and without a deadline, so a burst
would pile up there with nobody told to come back later. The gate keeps that queue here instead,
where it has a length (queue_max) and a wait limit (queue_timeout_s), and a refusal says when to
retry (Retry-After from the recent generation times).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque

from rag.core.errors import Busy


class Permit:
    """One slot, held for one generation; release() is idempotent."""

    def __init__(self, gate: GenerationGate | None, waited_s: float) -> None:
        self._gate = gate  # None: no slot (an answer that generates nothing)
        self._since = time.monotonic()
        self.waited_s = waited_s
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self._gate is not None:
                self._gate._release(time.monotonic() - self._since)


class GenerationGate:
    """A FIFO of waiting generations in front of `slots` running ones."""

    def __init__(self, slots: int, queue_max: int, queue_timeout_s: float) -> None:
        self.slots = max(1, slots)
        self.queue_max = queue_max
        self.queue_timeout_s = queue_timeout_s
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._mean_hold_s = 2.0  # a running mean of generation times, for Retry-After

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def resize(self, slots: int) -> None:
        """Follow llama-server's slot count (it can restart with another -np)."""
        self.slots = max(1, slots)
        self._wake()

    async def acquire(self) -> Permit:
        started = time.monotonic()
        if self.active < self.slots and not self._waiters:
            self.active += 1
            return Permit(self, 0.0)
        if len(self._waiters) >= self.queue_max or self.queue_timeout_s <= 0:
            raise self._busy(f"all {self.slots} generation slots are busy and {self.waiting} requests wait")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        granted = False
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await waiter
            granted = True
        except TimeoutError:
            raise self._busy(f"waited {self.queue_timeout_s:g} s for a generation slot") from None
        finally:
            if not granted:
                if waiter.done() and not waiter.cancelled():
                    self._release(None)  # the slot came as we gave up: pass it on
                else:
                    waiter.cancel()
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
        return Permit(self, time.monotonic() - started)

    def _release(self, held_s: float | None) -> None:
        self.active -= 1
        if held_s is not None:
            self._mean_hold_s = 0.8 * self._mean_hold_s + 0.2 * held_s
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.active < self.slots:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.active += 1
                waiter.set_result(None)

    def _busy(self, message: str) -> Busy:
        expected = self._mean_hold_s * (self.waiting + 1) / self.slots
        retry_after = min(60, max(1, math.ceil(expected)))
        return Busy(message, retry_after=retry_after, slots=self.slots, waiting=self.waiting)
