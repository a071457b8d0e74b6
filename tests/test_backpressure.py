"""Backpressure and cancellation: the generation gate alone, then the API against a one-slot llama-server."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter

import httpx
import pytest

from rag.answering.gate import GenerationGate
from rag.core.config import Settings
from rag.core.errors import Busy
from tests.chat_helpers import ask, changed, parse_sse, serve, upload
from tests.servers import Server

# --- the gate ---------------------------------------------------------------------------------------


def test_the_gate_admits_one_per_slot_and_queues_in_order():
    async def go():
        gate = GenerationGate(slots=2, queue_max=2, queue_timeout_s=5)
        first, second = await gate.acquire(), await gate.acquire()
        order: list[int] = []

        async def wait(i: int):
            permit = await gate.acquire()
            order.append(i)
            return permit

        waiters = [asyncio.create_task(wait(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)
        assert gate.active == 2 and gate.waiting == 2
        with pytest.raises(Busy) as caught:
            await gate.acquire()
        assert caught.value.status == 429 and caught.value.retry_after >= 1
        first.release()
        first.release()  # idempotent
        await asyncio.sleep(0.01)
        assert order == [1]
        second.release()
        permits = await asyncio.gather(*waiters)
        assert order == [1, 2] and gate.active == 2 and gate.waiting == 0
        for p in permits:
            p.release()
        assert gate.active == 0

    asyncio.run(go())


def test_a_waiter_gives_up_after_the_queue_timeout():
    async def go():
        gate = GenerationGate(slots=1, queue_max=5, queue_timeout_s=0.05)
        held = await gate.acquire()
        started = time.monotonic()
        with pytest.raises(Busy, match="waited"):
            await gate.acquire()
        assert time.monotonic() - started < 1
        assert gate.waiting == 0
        held.release()
        (await gate.acquire()).release()
        assert gate.active == 0

    asyncio.run(go())


def test_a_cancelled_waiter_leaves_no_trace_and_no_queue_means_no_wait():
    async def go():
        gate = GenerationGate(slots=1, queue_max=3, queue_timeout_s=10)
        held = await gate.acquire()
        waiter = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate.waiting == 0
        held.release()
        assert gate.active == 0
        strict = GenerationGate(slots=1, queue_max=0, queue_timeout_s=10)
        permit = await strict.acquire()
        with pytest.raises(Busy):
            await strict.acquire()
        permit.release()

    asyncio.run(go())


def test_the_gate_follows_a_new_slot_count():
    async def go():
        gate = GenerationGate(slots=1, queue_max=3, queue_timeout_s=5)
        held = await gate.acquire()
        waiter = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        gate.resize(2)
        permit = await asyncio.wait_for(waiter, 1)
        assert gate.active == 2
        held.release()
        permit.release()

    asyncio.run(go())


# --- against the real llama-server (one slot) -------------------------------------------------------


async def _one(client: httpx.AsyncClient, i: int) -> tuple[int, bool, httpx.Headers, str]:
    """One request of a burst, streamed or not, native or OpenAI-shaped: (status, ended well, headers, body)."""
    question = "When was the Eiffel Tower completed?"
    if i % 2:
        response = await client.post("/v1/chat", json=ask(question, max_tokens=6, stream=False))
        return (
            response.status_code,
            response.status_code == 200 and "done" in response.json(),
            response.headers,
            response.text,
        )
    native = i % 4 == 0
    path, body = (
        ("/v1/chat", ask(question, max_tokens=6))
        if native
        else ("/v1/chat/completions", {"messages": ask(question)["messages"], "max_tokens": 6, "stream": True})
    )
    async with client.stream("POST", path, json=body) as response:
        text = (await response.aread()).decode()
    if response.status_code != 200:
        return response.status_code, False, response.headers, text
    last = list(parse_sse(iter(text.splitlines())))[-1]
    return 200, (last.event == "done") if native else (last.data == "[DONE]"), response.headers, text


@pytest.mark.integration
def test_twenty_concurrent_requests_on_one_slot_are_answered_or_told_to_retry(backend_settings: Settings):
    settings = changed(backend_settings, queue_max=3, queue_timeout_s=60)

    async def burst(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            return await asyncio.gather(*(_one(client, i) for i in range(20)))

    with serve(settings) as url:
        upload(url)
        results = asyncio.run(burst(url))
    statuses = Counter(status for status, *_ in results)
    assert set(statuses) <= {200, 429}, [
        (status, body[:300]) for status, _, _, body in results if status not in (200, 429)
    ]
    assert statuses[200] >= 1 + 3 and statuses[429] >= 1, statuses
    for status, ended_well, headers, body in results:
        if status == 429:
            assert int(headers["retry-after"]) >= 1 and '"busy"' in body
        else:
            assert ended_well, body[-300:]


def _slot_busy(llama_url: str) -> bool:
    return any(slot["is_processing"] for slot in httpx.get(f"{llama_url}/slots", timeout=10).json())


@pytest.mark.integration
def test_a_client_that_disconnects_frees_the_llama_server_slot_at_once(
    backend_settings: Settings, endless_llama: Server
):
    llama_server = endless_llama  # writes until max_tokens, whatever the prompt style
    settings = changed(
        backend_settings, llm_url=llama_server.url, queue_max=0, queue_timeout_s=0, completion_stop_loops=False
    )  # a leaked permit would mean 429; its endless line repeats itself
    body = ask("Write a very long story about the Eiffel Tower.", max_tokens=500)
    with serve(settings) as url:
        upload(url)
        tokens = 0
        with httpx.stream("POST", f"{url}/v1/chat", json=body, timeout=120) as response:
            assert response.status_code == 200
            for event in parse_sse(response.iter_lines()):
                tokens += event.event == "token"
                if tokens == 3:
                    assert _slot_busy(llama_server.url), "generation is under way"
                    break
        left = time.monotonic()
        while _slot_busy(llama_server.url) and time.monotonic() - left < 30:
            time.sleep(0.05)
        freed_after = time.monotonic() - left
        assert not _slot_busy(llama_server.url)
        # 500 tokens take 10 s or more on this CPU; the slot must be free long before.
        print(f"slot freed {freed_after * 1000:.0f} ms after the client disconnected")
        assert freed_after < 2.0, f"slot still busy {freed_after:.1f} s after the client left"
        again = httpx.post(
            f"{url}/v1/chat", json=ask("When was the Eiffel Tower completed?", stream=False, max_tokens=4), timeout=120
        )
        assert again.status_code == 200, again.text


def _decoded(llama_url: str) -> int:
    """Tokens generated so far by the busy slot (0 while none is generating)."""
    slots = httpx.get(f"{llama_url}/slots", timeout=10).json()
    return max(
        (s["next_token"][0]["n_decoded"] for s in slots if s["is_processing"] and s.get("next_token")), default=0
    )


@pytest.mark.integration
@pytest.mark.parametrize("path", ["/v1/chat", "/v1/chat/completions"])
def test_a_non_streamed_request_whose_client_gives_up_frees_the_slot(
    backend_settings: Settings, endless_llama: Server, path: str
):
    llama_server = endless_llama  # writes until max_tokens, whatever the prompt style
    body = json.dumps({**ask("Write a very long story about the Eiffel Tower.", max_tokens=500), "stream": False})
    with serve(changed(backend_settings, llm_url=llama_server.url, completion_stop_loops=False)) as url:
        upload(url)
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body.encode())}\r\n\r\n{body}".encode()
            )
            deadline = time.monotonic() + 60
            while _decoded(llama_server.url) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _decoded(llama_server.url) >= 3, "generation is under way"
        left = time.monotonic()  # the client has closed its connection
        while _slot_busy(llama_server.url) and time.monotonic() - left < 30:
            time.sleep(0.05)
        freed_after = time.monotonic() - left
    print(f"{path}: slot freed {freed_after * 1000:.0f} ms after the client gave up")
    assert freed_after < 2.0, f"slot still busy {freed_after:.1f} s after the client left"
