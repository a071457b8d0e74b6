"""A pool of llama-servers behind the one client interface: routing by free slots and prompt-cache affinity.

Routing is ours, and thin: a generation goes to the ready server that holds its conversation's previous
turn (its slot still has that prompt, so only the new tokens are prefilled) when that server has a free
slot, else to the ready server with the most free slots. Among servers with as many free slots, a
conversation prefers the one its key ranks first (rendezvous hashing over the members' URLs): every API
replica with the same members ranks them alike, so a follow-up that the balancer sends to another
replica, which has not seen the conversation, still reaches the server of its first turn whenever that
turn found the servers equally free (an idle pool among them). The load balancers that would fit in front of
several HTTP servers (LiteLLM's router, nginx, HAProxy) know neither a conversation nor a llama-server
slot; the one that does (SGLang's cache-aware router) is a process of its own for SGLang's workers.

Each member is probed in the background every `probe_s` (`/health`, then `/props`), each probe within
`probe_timeout_s`: a member that fails a request, answers 503 (loading) or gives a probe no answer in time
(a stopped process still accepts connections) leaves the pool until a probe finds it healthy again. A
request waiting on a member that leaves goes to another (its first token, or its tokenize, had not
come), and `health()` reports the last probes without waiting for one. Every member must serve
the same model with the same per-slot context: a pool whose answering members differ is refused at start
(`check()`), a member that joins later with a difference is kept out and `/health` names why.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx
from cachetools import LRUCache

from rag.clients.backends import LLMBackend, RoutingCounts
from rag.clients.llm import LlamaServerClient, LLMHealth, Message, ServerProps, StreamDelta, StreamEnd
from rag.clients.member_health import MemberHealth, pool_state, reasons
from rag.core.errors import LLMUnavailable, PoolMismatch

log = logging.getLogger(__name__)

AFFINITY_ENTRIES = 4096  # conversations remembered (LRU): a few hundred bytes each
LEAVE_CHECK_S = 0.25  # how often a request waiting on a member looks whether it left the pool
T = TypeVar("T")


def first_question_key(messages: list[Message]) -> str | None:
    """What names a conversation across all its turns, for server affinity: its first question (None for
    a chat without one)."""
    first = next((m.get("content", "") for m in messages if m.get("role") == "user"), None)
    return None if first is None else hashlib.sha256(first.strip().encode("utf-8", "replace")).hexdigest()[:32]


def preference(conversation: str, url: str) -> int:
    """How much a conversation prefers a server (rendezvous hashing): the same on every replica, spread evenly
    over the servers across conversations."""
    return int.from_bytes(hashlib.sha256(f"{conversation}\n{url}".encode()).digest()[:8], "big")


@dataclass(eq=False)  # members are told apart by identity
class Member(MemberHealth):
    """One llama-server of the pool and what routing knows of it (its health: `MemberHealth`)."""

    kind: ClassVar[str] = "llama-server"
    client: LlamaServerClient
    props: ServerProps | None = None
    active: int = 0  # generations running here now
    served: int = 0
    cached_tokens: int = 0  # prompt tokens llama-server reused from a slot (timings.cache_n)
    prompt_tokens: int = 0  # all prompt tokens of the generations served (cache_n + prompt_n)

    @property
    def url(self) -> str:
        return self.client.base_url

    @property
    def slots(self) -> int:
        return self.props.total_slots if self.props else 1

    @property
    def free(self) -> int:
        return self.slots - self.active

    def describe(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"url": self.url, "state": self.state, "active": self.active, "slots": self.slots}
        if self.state != "ok":
            entry["reason"] = self.reason
        entry.update(served=self.served, failures=self.failures)
        if self.prompt_tokens:
            entry["prompt_reuse"] = round(self.cached_tokens / self.prompt_tokens, 3)
        return entry


@dataclass
class AffinityStats:
    """Follow-ups whose conversation was known, and whether they went back to its server."""

    routed: int = 0  # went to the server of the previous turn
    moved: int = 0  # that server was busy or out of the pool: the least loaded took it
    cached_tokens: int = 0
    prompt_tokens: int = 0
    by_conversation: LRUCache[str, Member] = field(default_factory=lambda: LRUCache(maxsize=AFFINITY_ENTRIES))


class LlamaServerPool:
    """Several llama-servers serving one model, used like one LlamaServerClient."""

    def __init__(
        self,
        urls: list[str],
        *,
        model: str = "default",
        timeout: float = 120.0,
        probe_s: float = 2.0,
        probe_timeout_s: float = 3.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.members = [Member(LlamaServerClient(u, model=model, timeout=timeout, transport=transport)) for u in urls]
        self.model = model
        self.base_url = ",".join(m.url for m in self.members)
        self.probe_s = probe_s
        self.probe_timeout_s = probe_timeout_s
        self.silent: set[Member] = set()  # members whose last probe got no answer in time
        self.affinity = AffinityStats()
        self._prober: asyncio.Task[None] | None = None
        self._probed = False

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        for member in self.members:
            await member.client.aclose()

    # Membership.

    async def check(self) -> None:
        """Probe every member once; raise PoolMismatch naming the difference when the answering ones
        serve different models or contexts. Then keep probing in the background."""
        await self._probe_all()
        self._probed = True
        refused = [m for m in self.members if m.state == "refused"]
        if refused:
            reference = next(m.url for m in self.members if m.state == "ok")
            differences = "; ".join(f"{m.url} vs {reference}: {m.reason}" for m in refused)
            raise PoolMismatch(f"the llama-servers of RAG_LLM_URL differ: {differences}")
        self._start_probing()

    async def _first_probe(self) -> None:
        """Before the first request of a pool nobody checked (the probes run in the background after)."""
        if not self._probed:
            self._probed = True
            await self._probe_all()
        self._start_probing()

    def _start_probing(self) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_forever())

    async def _probe_forever(self) -> None:
        while True:
            if self._probed:
                await asyncio.sleep(self.probe_s)
            await self._probe_all()
            self._probed = True

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe_within_budget(m) for m in self.members))

    async def _probe_within_budget(self, member: Member) -> None:
        """Probe `member`; one that gives no answer within `probe_timeout_s` (accepts, never answers) is down."""
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                await self._probe(member)
        except TimeoutError:
            self.silent.add(member)
            member.leave("down", f"no answer to /health or /props within {self.probe_timeout_s:g} s")
        else:
            self.silent.discard(member)

    async def _probe(self, member: Member) -> None:
        health = await member.client.health()
        if health.state != "ok":
            member.leave(health.state, health.reason or health.state)
            return
        try:
            props = await member.client.props()
        except (LLMUnavailable, httpx.HTTPError) as exc:
            member.leave("down", str(exc))
            return
        # The pool's model is what its ready members serve: once none is (all restarted, with a new
        # context say), the first to answer sets it again, as a single server's client would take it.
        reference = next((m.props for m in self.members if m.state == "ok" and m is not member and m.props), props)
        difference = _difference_of(reference, props)
        if difference:
            member.refuse(f"not the pool's model ({difference})")
            return
        member.join(f" ({props.total_slots} slots)")
        member.props = props

    def _ready(self) -> list[Member]:
        ready = [m for m in self.members if m.ready]
        if not ready:
            raise LLMUnavailable(f"no llama-server of the pool is ready ({reasons(self.members)})")
        return ready

    def pick(self, affinity: str | None = None) -> Member:
        """The conversation's previous server while it is ready with a free slot, else the least loaded."""
        ready = self._ready()
        known = self.affinity.by_conversation.get(affinity) if affinity else None
        if known is not None:
            if known in ready and known.free > 0:
                self.affinity.routed += 1
                return known
            self.affinity.moved += 1
        if affinity is None:
            return max(ready, key=lambda m: (m.free, -m.served))
        return max(ready, key=lambda m: (m.free, preference(affinity, m.url)))

    def _remember(self, affinity: str | None, member: Member) -> None:
        if affinity is not None:
            self.affinity.by_conversation[affinity] = member

    # The client interface.

    async def health(self) -> LLMHealth:
        """The pool's state from the members' last probes (they run in the background: none is awaited here)."""
        self._start_probing()
        state = pool_state(m.state for m in self.members)
        return LLMHealth(state) if state == "ok" else LLMHealth(state, reasons(self.members))

    def describe(self) -> list[dict[str, Any]]:
        """Every member as /health and /metrics show it."""
        return [m.describe() for m in self.members]

    def routing(self) -> RoutingCounts:
        stats = self.affinity
        return RoutingCounts(stats.routed, stats.moved, stats.cached_tokens, stats.prompt_tokens)

    async def props(self) -> ServerProps:
        """The pool's model and per-slot context, with the slots of its ready members summed."""
        await self._first_probe()
        ready = self._ready()
        first = next((m.props for m in ready if m.props), None)
        if first is None:
            raise LLMUnavailable("no llama-server of the pool has answered /props yet")
        return replace(first, total_slots=sum(m.slots for m in ready))

    async def slots(self) -> list[dict[str, Any]]:
        await self._first_probe()
        found: list[dict[str, Any]] = []
        for member in self._ready():
            found += [{**slot, "server": member.url} for slot in await self._on(member, lambda c: c.slots())]
        return found

    async def tokenize(self, content: str, *, add_special: bool = False) -> list[int]:
        return await self._any(lambda c: c.tokenize(content, add_special=add_special))

    async def apply_template(self, messages: list[Message]) -> str:
        return await self._any(lambda c: c.apply_template(messages))

    async def count_chat_tokens(self, messages: list[Message]) -> int:
        return await self._any(lambda c: c.count_chat_tokens(messages))

    async def complete_chat(
        self, messages: list[Message], *, max_tokens: int, temperature: float = 0.2
    ) -> dict[str, Any]:
        return await self._any(lambda c: c.complete_chat(messages, max_tokens=max_tokens, temperature=temperature))

    def stream_chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int,
        temperature: float = 0.2,
        extra: dict[str, Any] | None = None,
        affinity: str | None = None,
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        return self._stream(
            lambda c: c.stream_chat(messages, max_tokens=max_tokens, temperature=temperature, extra=extra), affinity
        )

    def stream_completion(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        stop: list[str] | None = None,
        extra: dict[str, Any] | None = None,
        affinity: str | None = None,
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        return self._stream(
            lambda c: c.stream_completion(
                prompt, max_tokens=max_tokens, temperature=temperature, stop=stop, extra=extra
            ),
            affinity,
        )

    # Sending.

    async def _on(self, member: Member, call: Callable[[LlamaServerClient], Awaitable[T]]) -> T:
        try:
            return await self._while_in_pool(member, call(member.client))
        except LLMUnavailable as exc:
            member.failed(exc.message)
            raise

    async def _any(self, call: Callable[[LlamaServerClient], Awaitable[T]]) -> T:
        """`call` on the least loaded ready member; one that turns out down gives way to the next."""
        await self._first_probe()
        while True:
            member = self.pick()
            try:
                return await self._on(member, call)
            except LLMUnavailable:
                continue  # it left the pool: pick() raises once none is left

    async def _stream(
        self, start: Callable[[LlamaServerClient], AsyncIterator[StreamDelta | StreamEnd]], affinity: str | None
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        """The stream of the member pick() chose. One that fails before its first item gives way to the
        next; one that breaks off mid-answer raises (the answer's stream ends with an `error` event)."""
        await self._first_probe()
        while True:
            member = self.pick(affinity)
            member.active += 1
            began = False
            stream = start(member.client)
            try:
                async for item in self._answering(member, stream):
                    began = True
                    if isinstance(item, StreamEnd):
                        self._served(member, item, affinity)
                    yield item
                return
            except LLMUnavailable as exc:
                member.failed(exc.message)
                if began:
                    raise
            finally:
                member.active -= 1
                close = getattr(stream, "aclose", None)  # the client's streams are async generators
                if close is not None:
                    await close()

    async def _answering(
        self, member: Member, stream: AsyncIterator[StreamDelta | StreamEnd]
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        """`stream`'s items; LLMUnavailable when `member` leaves the pool before the first one came."""
        try:
            first = await self._while_in_pool(member, anext(stream))
        except StopAsyncIteration:
            return
        yield first
        async for item in stream:
            yield item

    async def _while_in_pool(self, member: Member, step: Awaitable[T]) -> T:
        """`step`, given up with LLMUnavailable once a probe finds `member` silent: a stopped llama-server
        takes the request and never answers, for as long as the read timeout. (A member that left for a
        failed probe but answers is waited for: its requests are under way.)"""
        waiting = asyncio.timeout(None)
        watch = asyncio.ensure_future(self._expire_when_silent(member, waiting))
        try:
            async with waiting:
                return await step
        except TimeoutError:
            if not waiting.expired():
                raise  # the step's own
            raise LLMUnavailable(f"llama-server {member.url} went silent before it answered: {member.reason}") from None
        finally:
            watch.cancel()

    async def _expire_when_silent(self, member: Member, waiting: asyncio.Timeout) -> None:
        """End `waiting` (its block raises TimeoutError) once a probe finds `member` silent."""
        while member not in self.silent:
            await asyncio.sleep(LEAVE_CHECK_S)
        waiting.reschedule(asyncio.get_running_loop().time())

    def _served(self, member: Member, end: StreamEnd, affinity: str | None) -> None:
        member.served += 1
        cached, new = int(end.timings.get("cache_n") or 0), int(end.timings.get("prompt_n") or 0)
        member.cached_tokens += cached
        member.prompt_tokens += cached + new
        if affinity is not None and self.affinity.by_conversation.get(affinity) is member:
            self.affinity.cached_tokens += cached
            self.affinity.prompt_tokens += cached + new
        self._remember(affinity, member)


def _difference_of(first: ServerProps, other: ServerProps) -> str:
    """What differs between two servers' /props that the budget and the answers depend on ('' if nothing)."""
    if first.model != other.model:
        return f"model {first.model!r} vs {other.model!r}"
    names = [Path(p).name for p in (first.model_path, other.model_path) if p]
    if len(names) == 2 and names[0] != names[1]:
        return f"model file {names[0]} vs {names[1]}"
    if first.n_ctx != other.n_ctx:
        return f"n_ctx per slot {first.n_ctx} vs {other.n_ctx}"
    return ""


async def refuse_mixed_pool(urls: list[str]) -> None:
    """Raise PoolMismatch when the servers at `urls` that answer serve different models or contexts."""
    pool = LlamaServerPool(urls, probe_s=3600)
    try:
        await pool.check()
    finally:
        await pool.aclose()


def llm_client(
    urls: list[str], *, model: str, timeout: float = 120.0, probe_s: float = 2.0, probe_timeout_s: float = 3.0
) -> LLMBackend:
    """One llama-server's client, or a pool for several."""
    if len(urls) == 1:
        return LlamaServerClient(urls[0], model=model, timeout=timeout)
    return LlamaServerPool(urls, model=model, timeout=timeout, probe_s=probe_s, probe_timeout_s=probe_timeout_s)
