"""Unit tests of the llama-server pool's routing (rag.clients.llm_pool) over a stand-in transport: a member
that answers 503 while loading is skipped until healthy; every member down is LLMUnavailable (503)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from rag.clients.llm_pool import LlamaServerPool, first_question_key
from rag.core.errors import LLMUnavailable


class Servers:
    """llama-servers by host: `loading` ones answer 503 on /health and /props; `gone` ones refuse to connect."""

    def __init__(self) -> None:
        self.loading: set[str] = set()
        self.gone: set[str] = set()
        self.tokenized: list[str] = []
        self.n_ctx = 4096

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.gone:
            raise httpx.ConnectError("connection refused", request=request)
        if host in self.loading:
            return httpx.Response(503, json={"error": {"message": "Loading model"}})
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            body: dict[str, Any] = {
                "total_slots": 1,
                "model_alias": "m",
                "default_generation_settings": {"n_ctx": self.n_ctx},
            }
            return httpx.Response(200, json=body)
        if request.url.path == "/tokenize":
            self.tokenized.append(host)
            return httpx.Response(200, json={"tokens": [1, 2, 3]})
        return httpx.Response(404)


def test_a_loading_member_is_skipped_until_it_is_healthy() -> None:
    servers = Servers()
    servers.loading.add("b")

    async def run() -> tuple[list[str], int, list[str], int]:
        pool = LlamaServerPool(["http://a:1", "http://b:1"], transport=servers.transport(), probe_s=0.05)
        try:
            await pool.check()
            states = [m.state for m in pool.members]
            slots_while_loading = (await pool.props()).total_slots
            for _ in range(3):
                await pool.tokenize("x")
            servers.loading.clear()
            await asyncio.sleep(0.5)  # the background probes find it healthy
            return states, slots_while_loading, [m.state for m in pool.members], (await pool.props()).total_slots
        finally:
            await pool.aclose()

    states, slots_while_loading, states_after, slots_after = asyncio.run(run())
    assert states == ["ok", "loading"] and slots_while_loading == 1
    assert servers.tokenized == ["a", "a", "a"]
    assert states_after == ["ok", "ok"] and slots_after == 2


def test_a_member_that_stops_answering_leaves_and_the_request_goes_to_the_other() -> None:
    servers = Servers()

    async def run() -> list[str]:
        pool = LlamaServerPool(["http://a:1", "http://b:1"], transport=servers.transport(), probe_s=3600)
        try:
            await pool.check()
            servers.gone.add("a")
            await pool.tokenize("x")
            return [m.state for m in pool.members]
        finally:
            await pool.aclose()

    assert asyncio.run(run()) == ["down", "ok"]
    assert servers.tokenized == ["b"]


def test_every_member_restarted_with_a_new_context_serves_again() -> None:
    servers = Servers()

    async def run() -> tuple[list[str], int]:
        pool = LlamaServerPool(["http://a:1", "http://b:1"], transport=servers.transport(), probe_s=3600)
        try:
            await pool.check()
            servers.loading.update({"a", "b"})  # both restart...
            await pool._probe_all()  # the background probe's round (/health reports its last state)
            servers.loading.clear()
            servers.n_ctx = 8192  # ...with a larger context
            await pool._probe_all()
            return [m.state for m in pool.members], (await pool.props()).n_ctx
        finally:
            await pool.aclose()

    assert asyncio.run(run()) == (["ok", "ok"], 8192)


def test_every_member_down_is_llm_unavailable_naming_each() -> None:
    servers = Servers()
    servers.gone.update({"a", "b"})

    async def run() -> None:
        pool = LlamaServerPool(["http://a:1", "http://b:1"], transport=servers.transport(), probe_s=3600)
        try:
            await pool.check()
            await pool.tokenize("x")
        finally:
            await pool.aclose()

    with pytest.raises(LLMUnavailable, match=r"no llama-server of the pool is ready \(http://a:1: .*http://b:1: "):
        asyncio.run(run())


def test_a_conversation_is_known_by_its_first_question() -> None:
    first = [{"role": "user", "content": "When was it built?"}]
    later = [*first, {"role": "assistant", "content": "In 1889."}, {"role": "user", "content": "How tall?"}]
    assert (
        first_question_key(first) == first_question_key(later) != first_question_key([{"role": "user", "content": "?"}])
    )


def test_replicas_send_a_conversation_to_the_same_server_while_the_servers_are_equally_free() -> None:
    """Two API replicas over the same two llama-servers, neither having seen the conversations: each sends every
    conversation where the other does (so a follow-up through either finds its prompt), the conversations
    spread over both servers, and a busy preferred server gives way to a free one."""
    servers = Servers()

    async def run() -> tuple[list[list[str]], str, str]:
        replicas = [
            LlamaServerPool(["http://a:1", "http://b:1"], transport=servers.transport(), probe_s=3600) for _ in range(2)
        ]
        try:
            for pool in replicas:
                await pool.check()
            keys = [first_question_key([{"role": "user", "content": f"Question {i}?"}]) for i in range(40)]
            chosen = [[pool.pick(key).url for key in keys] for pool in replicas]
            home = replicas[0].pick(keys[0])
            home.active = home.slots
            elsewhere = replicas[0].pick(keys[0]).url
            home.active = 0
            return chosen, home.url, elsewhere
        finally:
            for pool in replicas:
                await pool.aclose()

    chosen, home, elsewhere = asyncio.run(run())
    assert chosen[0] == chosen[1]
    assert 10 <= chosen[0].count("http://a:1") <= 30, chosen[0]
    assert elsewhere != home
