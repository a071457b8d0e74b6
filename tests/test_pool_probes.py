"""Unit tests of the llama-server pool's probes (rag.clients.llm_pool) over a stand-in transport: a member
that goes silent (takes requests, never answers, as a stopped llama-server does) leaves the pool within the
probe budget, the requests waiting on it go to the other member, and `health()` never waits on it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from rag.clients.llm_pool import LlamaServerPool


class Servers:
    """llama-servers by host; `silent` ones never answer anything."""

    def __init__(self) -> None:
        self.silent: set[str] = set()
        self.tokenized: list[str] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.silent:
            await asyncio.sleep(3600)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            body: dict[str, Any] = {
                "total_slots": 1,
                "model_alias": "m",
                "default_generation_settings": {"n_ctx": 4096},
            }
            return httpx.Response(200, json=body)
        if request.url.path == "/tokenize":
            self.tokenized.append(host)
            return httpx.Response(200, json={"tokens": [1, 2, 3]})
        return httpx.Response(404)


def test_a_member_gone_silent_leaves_within_the_probe_budget_and_its_requests_go_to_the_other() -> None:
    servers = Servers()

    async def run() -> tuple[float, list[str], str, float]:
        pool = LlamaServerPool(
            ["http://a:1", "http://b:1"], transport=servers.transport(), probe_s=0.2, probe_timeout_s=0.5, timeout=60
        )
        try:
            await pool.check()
            servers.silent.add("a")  # the first member: the pool sends a tokenize there first
            started = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*(pool.tokenize("x") for _ in range(6))), 30)
            took = time.monotonic() - started
            asked = time.monotonic()
            await pool.health()
            return took, [m.state for m in pool.members], pool.members[0].reason, time.monotonic() - asked
        finally:
            await pool.aclose()

    took, states, reason, health_s = asyncio.run(run())
    assert states == ["down", "ok"] and "no answer" in reason
    assert servers.tokenized == ["b"] * 6
    # Probed every 0.2 s within 0.5 s, it is out in under a second; the request timeout is 60 s.
    assert took < 10 and health_s < 1, (took, health_s)


def test_health_reports_the_last_probes_without_waiting_on_a_silent_member() -> None:
    servers = Servers()
    servers.silent.add("b")

    async def run() -> tuple[float, list[float], list[str]]:
        pool = LlamaServerPool(["http://a:1", "http://b:1"], transport=servers.transport(), probe_s=0.2)
        try:
            started = time.monotonic()
            await pool.check()  # its first probes end at the budget (3 s), not at a timeout
            checked = time.monotonic() - started
            took = []
            for _ in range(5):
                asked = time.monotonic()
                await pool.health()
                took.append(time.monotonic() - asked)
            return checked, took, [m.state for m in pool.members]
        finally:
            await pool.aclose()

    checked, took, states = asyncio.run(run())
    assert states == ["ok", "down"]
    assert checked < 10 and max(took) < 1, (checked, took)
