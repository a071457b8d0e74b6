"""A pool of embedding servers used like one EmbeddingClient: each batch goes to the member with the
fewest requests outstanding (ingestion's concurrent batches spread over the pool).

A member that fails a request (unreachable, 503, a timeout) leaves the pool for `rest_s` and the batch
goes to the next; after its rest it is tried again by the next batch, and stays if it answers. Writing
this is a few dozen lines: an HTTP load balancer in front would hide which member is down from /health.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import numpy as np

from rag.clients.embedding import EmbeddingClient
from rag.core.embeddings_api import EmbeddingsUsage, InputType
from rag.core.errors import EmbedderUnavailable

T = TypeVar("T")


@dataclass(eq=False)  # members are told apart by identity
class EmbedMember:
    client: EmbeddingClient
    outstanding: int = 0
    served: int = 0
    failures: int = 0
    resting_until: float = 0.0
    reason: str = ""

    @property
    def url(self) -> str:
        return self.client.base_url

    def resting(self) -> bool:
        return time.monotonic() < self.resting_until


class EmbeddingPool:
    """Several embedding servers of one model behind EmbeddingClient's interface."""

    def __init__(
        self,
        urls: list[str],
        *,
        model: str,
        timeout: float = 120.0,
        rest_s: float = 5.0,
        stall_s: float = 3.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # The pool moves a failed batch to another member at once: a member's own retries would only wait.
        self.members = [
            EmbedMember(
                EmbeddingClient(u, model=model, timeout=timeout, transport=transport, retries=0, stall_s=stall_s)
            )
            for u in urls
        ]
        self.model = model
        self.base_url = ",".join(m.url for m in self.members)
        self.servers = len(self.members)
        self.rest_s = rest_s

    async def aclose(self) -> None:
        for member in self.members:
            await member.client.aclose()

    async def embed(self, texts: list[str], kind: InputType = "passage") -> np.ndarray:
        return await self._send(lambda c: c.embed(texts, kind))

    async def embed_one(self, text: str, kind: InputType = "passage") -> np.ndarray:
        vector: np.ndarray = (await self.embed([text], kind))[0]
        return vector

    async def embed_with_usage(self, texts: list[str], kind: InputType = "query") -> tuple[np.ndarray, EmbeddingsUsage]:
        return await self._send(lambda c: c.embed_with_usage(texts, kind))

    async def health(self) -> dict[str, Any]:
        """`ok` (with the first healthy member's fields) while any member is; every member under `servers`."""
        servers = []
        for member, state in zip(self.members, await asyncio.gather(*map(self._probe, self.members)), strict=True):
            if state["state"] == "ok":
                member.resting_until = 0.0
            servers.append({**state, "url": member.url, "outstanding": member.outstanding, "served": member.served})
        healthy = [s for s in servers if s["state"] == "ok"]
        if healthy:
            return {
                **{k: v for k, v in healthy[0].items() if k not in ("url", "outstanding", "served")},
                "servers": servers,
            }
        states = {s["state"] for s in servers}
        reason = "; ".join(f"{s['url']}: {s.get('reason', s['state'])}" for s in servers)
        return {"state": "loading" if "loading" in states else "down", "reason": reason, "servers": servers}

    async def _probe(self, member: EmbedMember) -> dict[str, Any]:
        """`member`'s /health within `stall_s`: a stopped server accepts the request and never answers."""
        try:
            async with asyncio.timeout(member.client.stall_s):
                return await member.client.health()
        except TimeoutError:
            return {"state": "down", "reason": f"no answer to /health within {member.client.stall_s:g} s"}

    def describe(self) -> list[dict[str, Any]]:
        """Every member as /metrics shows it (`resting`: it failed a request lately)."""
        return [
            {
                "url": m.url,
                "state": "resting" if m.resting() else "ok",
                "active": m.outstanding,
                "served": m.served,
                "failures": m.failures,
            }
            for m in self.members
        ]

    def pick(self, tried: set[int]) -> EmbedMember:
        """The member with the fewest requests outstanding, resting ones last."""
        left = [m for i, m in enumerate(self.members) if i not in tried]
        if not left:
            reasons = "; ".join(f"{m.url}: {m.reason}" for m in self.members)
            raise EmbedderUnavailable(f"no embedding server of the pool answers ({reasons})")
        return min(left, key=lambda m: (m.resting(), m.outstanding, m.served))

    async def _send(self, call: Callable[[EmbeddingClient], Awaitable[T]]) -> T:
        tried: set[int] = set()
        while True:
            member = self.pick(tried)
            tried.add(self.members.index(member))
            member.outstanding += 1
            try:
                result = await call(member.client)
            except EmbedderUnavailable as exc:
                member.failures += 1
                member.reason = exc.message
                member.resting_until = time.monotonic() + self.rest_s
                continue
            finally:
                member.outstanding -= 1
            member.served += 1
            member.resting_until = 0.0
            return result


EmbeddingBackend = EmbeddingClient | EmbeddingPool


def embedding_client(urls: list[str], *, model: str, timeout: float = 120.0, stall_s: float = 3.0) -> EmbeddingBackend:
    """One server's client, or a pool for several."""
    if len(urls) == 1:
        return EmbeddingClient(urls[0], model=model, timeout=timeout, stall_s=stall_s)
    return EmbeddingPool(urls, model=model, timeout=timeout, stall_s=stall_s)
