"""A pool of embedding servers used like one EmbeddingClient: each batch goes to the member with the
fewest requests outstanding (ingestion's concurrent batches spread over the pool).

A member that fails a request (unreachable, 503, a timeout) leaves the pool for `rest_s` and the batch
goes to the next; after its rest it is tried again by the next batch, and stays if it answers. Writing
this is a few dozen lines: an HTTP load balancer in front would hide which member is down from /health.

Every member must serve the same model, as in the llama-server pool: vectors of two models of one
dimension (MiniLM and E5, both 384) would go into one collection unnoticed. A member's /health names its
model before its first batch (and again after it failed); one serving another model than the pool's
(the configured RAG_EMBED_MODEL when a member serves it, else the one its members serve) is kept out, and
/health says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import httpx
import numpy as np

from rag.clients.backends import EmbeddingBackend
from rag.clients.embedding import EmbeddingClient
from rag.clients.member_health import MemberHealth, pool_state, reasons
from rag.core.embeddings_api import EmbeddingsUsage, InputType
from rag.core.errors import EmbedderUnavailable

T = TypeVar("T")


@dataclass(eq=False)  # members are told apart by identity
class EmbedMember(MemberHealth):
    """One embedding server of the pool and what routing knows of it (its health: `MemberHealth`)."""

    kind: ClassVar[str] = "embedding server"
    client: EmbeddingClient
    outstanding: int = 0
    served: int = 0
    model: str | None = None  # what its /health said it serves (None: not asked since it last failed)

    @property
    def url(self) -> str:
        return self.client.base_url

    @property
    def refused(self) -> bool:
        return self.state == "refused"


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
                member.join()  # a member resting from a failed batch is tried again at once
                self._identify(member, state)
                if member.refused:
                    state = {"state": "refused", "reason": member.reason}
            else:
                member.leave(state["state"], str(state.get("reason", state["state"])))
            servers.append({**state, "url": member.url, "outstanding": member.outstanding, "served": member.served})
        healthy = [s for s in servers if s["state"] == "ok"]
        if healthy:
            return {
                **{k: v for k, v in healthy[0].items() if k not in ("url", "outstanding", "served")},
                "servers": servers,
            }
        return {"state": pool_state(s["state"] for s in servers), "reason": reasons(self.members), "servers": servers}

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
                "state": "refused" if m.refused else "resting" if m.resting() else "ok",
                "active": m.outstanding,
                "served": m.served,
                "failures": m.failures,
            }
            for m in self.members
        ]

    def pick(self, tried: set[int]) -> EmbedMember:
        """The member with the fewest requests outstanding, resting ones last (refused ones after them)."""
        left = [m for i, m in enumerate(self.members) if i not in tried]
        if not left:
            raise EmbedderUnavailable(f"no embedding server of the pool answers ({reasons(self.members)})")
        return min(left, key=lambda m: (m.refused, m.resting(), m.outstanding, m.served))

    def _identify(self, member: EmbedMember, health: dict[str, Any]) -> None:
        """Note the model `member` serves (from its /health), and refuse the members that serve another
        than the pool's: the configured one when a member serves it, else the one its members serve."""
        member.model = str(health.get("model") or "")
        served = [m.model for m in self.members if m.model]
        if not served:
            return
        kept = [m.model for m in self.members if m.model and not m.refused]
        ours = self.model if self.model in served else (kept or served)[0]
        for m in self.members:
            if m.model and m.model != ours:
                m.refuse(f"not the pool's model ({m.model} vs {ours})")
            elif m.refused:
                m.pardon()

    async def _admitted(self, member: EmbedMember) -> bool:
        """Whether `member` may take a batch: it answers /health with the pool's model (one serving
        another than the configured model waits until the others have said what they serve)."""
        if member.model is None:
            if not await self._ask(member):
                return False
            if member.model not in ("", self.model):
                await asyncio.gather(*(self._ask(m) for m in self.members if m.model is None))
        return not member.refused

    async def _ask(self, member: EmbedMember) -> bool:
        """Ask `member` its model; a member that does not answer rests, as after a failed batch."""
        health = await member.client.health()
        if health["state"] != "ok":
            member.failed(str(health.get("reason", health["state"])), self.rest_s)
            return False
        self._identify(member, health)
        return True

    async def _send(self, call: Callable[[EmbeddingClient], Awaitable[T]]) -> T:
        tried: set[int] = set()
        while True:
            member = self.pick(tried)
            tried.add(self.members.index(member))
            member.outstanding += 1  # from the start: the batches that pick meanwhile go to the others
            try:
                if not await self._admitted(member):
                    continue
                result = await call(member.client)
            except EmbedderUnavailable as exc:
                member.failed(exc.message, self.rest_s)
                member.model = None  # it may come back serving another model
                continue
            finally:
                member.outstanding -= 1
            member.served += 1
            member.join()
            return result


def embedding_client(urls: list[str], *, model: str, timeout: float = 120.0, stall_s: float = 3.0) -> EmbeddingBackend:
    """One server's client, or a pool for several."""
    if len(urls) == 1:
        return EmbeddingClient(urls[0], model=model, timeout=timeout, stall_s=stall_s)
    return EmbeddingPool(urls, model=model, timeout=timeout, stall_s=stall_s)
