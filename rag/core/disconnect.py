"""Work for an HTTP request that stops when its client goes away.

A streamed response learns of a disconnect from its server; a plain request is not cancelled by it,
so without this a client that timed out would keep the work (a llama-server slot to max_tokens, an
embedding batch) going for nobody. Both the API and the embedding server poll with this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rag.core.errors import ClientClosed

log = logging.getLogger(__name__)

T = TypeVar("T")


async def unless_disconnected(
    work: Awaitable[T], is_disconnected: Callable[[], Awaitable[bool]], *, poll_s: float
) -> T:
    """The result of `work`; if `is_disconnected()` (polled every `poll_s`) says the client went away first,
    the work is cancelled and ClientClosed raised."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await is_disconnected():
                log.info("client went away: its work is stopped")
                raise ClientClosed("the client closed the connection")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
