"""Pools of real llama-servers (the bundled Gemma 270M, two on this CPU) and embedding servers behind one API:
routing by free slots, follow-ups sent back to their server, a killed server, a mixed pool refused."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rag.clients.llm_pool import LlamaServerPool
from rag.core.config import Settings
from rag.core.errors import PoolMismatch
from tests.chat_helpers import AMAZON_QUESTIONS, ask, changed, parse_sse, preferred_server, serve, upload
from tests.conftest import _clean_env
from tests.servers import Server, free_port, start_llama_server, start_server

ENDLESS = 'root ::= "one, two, three" more\nmore ::= ", more" more'  # writes until max_tokens


@pytest.fixture(scope="module")
def endless_pair(generator_model: Path, session_dir: Path) -> Iterator[list[Server]]:
    """Two real llama-servers that write until max_tokens (streams that last while a test acts)."""
    servers = [start_llama_server(generator_model, session_dir, extra=["--grammar", ENDLESS]) for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def _pool_metric(url: str, name: str) -> dict[str, float]:
    """Values of one of the API's pool metrics, by label text."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {labels: float(v) for labels, v in re.findall(rf"^{name}(\{{[^}}]*\}})?\s+(\S+)$", text, re.MULTILINE)}


def test_two_streams_at_once_go_to_the_two_servers(endless_pair: list[Server]) -> None:
    async def two_at_once() -> list[int]:
        pool = LlamaServerPool([s.url for s in endless_pair], model="gemma-3-270m-q4_k_m")
        try:
            await pool.check()
            message = [{"role": "user", "content": "Count."}]
            streams = [pool.stream_chat(message, max_tokens=64) for _ in range(2)]
            for stream in streams:
                await anext(stream)  # both are generating now
            busy = [m.active for m in pool.members]
            for stream in streams:
                await stream.aclose()  # type: ignore[attr-defined]
            return busy
        finally:
            await pool.aclose()

    assert asyncio.run(two_at_once()) == [1, 1]


def test_a_followup_goes_back_to_its_server_and_reuses_its_prompt(
    generator_model: Path, session_dir: Path, backend_settings: Settings
) -> None:
    servers = [start_llama_server(generator_model, session_dir) for _ in range(2)]
    try:
        # Spans off: a line asked again under the span grammar would be one request more to count.
        settings = changed(backend_settings, llm_url=",".join(s.url for s in servers), completion_spans="off")
        with serve(settings) as url:
            upload(url)
            members = [s["url"] for s in httpx.get(f"{url}/health", timeout=30).json()["backends"]["llm"]["servers"]]
            first = ask("When was the Eiffel Tower completed?")
            home = preferred_server(first, members)
            reply = httpx.post(f"{url}/v1/chat", json={**first, "stream": False}, timeout=120).json()
            turns = [*first["messages"], {"role": "assistant", "content": reply["answer"]}]
            # Another conversation in between, one that an idle pool sends to the other server (questions the
            # documents answer, so that each reaches a llama-server: 2**-10 that none prefers the other one).
            other = next(q for q in map(ask, AMAZON_QUESTIONS) if preferred_server(q, members) != home)
            httpx.post(f"{url}/v1/chat", json={**other, "stream": False}, timeout=120)
            follow = {**first, "messages": [*turns, {"role": "user", "content": "How tall is it?"}], "stream": False}
            done = httpx.post(f"{url}/v1/chat", json=follow, timeout=120).json()
            health = httpx.get(f"{url}/health", timeout=30).json()
            routed = _pool_metric(url, "rag_llm_affinity_followups")
            reuse = _pool_metric(url, "rag_llm_affinity_prompt_reuse_ratio")
        assert {s["url"]: s["served"] for s in health["backends"]["llm"]["servers"]} == {
            home: 2,
            next(m for m in members if m != home): 1,
        }
        assert routed['{to="previous_server"}'] == 1
        assert done["done"]["cache_n"] > 0 and reuse[""] > 0.5, (done["done"], reuse)
    finally:
        for server in servers:
            server.stop()


def test_a_killed_server_ends_its_stream_with_an_error_and_new_chats_go_on(
    generator_model: Path, session_dir: Path, backend_settings: Settings
) -> None:
    servers = [start_llama_server(generator_model, session_dir, extra=["--grammar", ENDLESS]) for _ in range(2)]
    try:
        settings = changed(
            backend_settings,
            llm_url=",".join(s.url for s in servers),
            pool_probe_s=0.5,
            completion_stop_loops=False,
            completion_spans="off",  # streamed as generated: the kill lands mid-stream
        )
        with serve(settings) as url:
            upload(url)
            body = {**ask("Write a very long story about the Eiffel Tower.", max_tokens=2000), "stream": True}
            events = []
            busy: Server | None = None
            with httpx.stream("POST", f"{url}/v1/chat", json=body, timeout=120) as response:
                for event in parse_sse(response.iter_lines()):
                    events.append(event.event)
                    if busy is None and events.count("token") == 3:  # once: the next event may be the error
                        busy = next(s for s in servers if _busy(s.url))
                        os.killpg(busy.pid, signal.SIGKILL)
            assert busy is not None, events
            assert events[-1] == "error" and "done" not in events
            after = httpx.post(f"{url}/v1/chat", json={**ask("When was it completed?"), "stream": False}, timeout=120)
            assert after.status_code == 200, after.text
            states = {
                s["url"]: s["state"]
                for s in httpx.get(f"{url}/health", timeout=30).json()["backends"]["llm"]["servers"]
            }
            assert states[busy.url] == "down"
            assert [s for s in states.values() if s == "ok"] == ["ok"]
            # The same server started again on its port joins the pool by itself.
            port = int(busy.url.rsplit(":", 1)[1])
            command = [*busy.process.args[:]]  # type: ignore[misc]
            servers.append(start_server("llama-server", list(command), port, session_dir))
            for _ in range(50):
                llm = httpx.get(f"{url}/health", timeout=30).json()["backends"]["llm"]
                if all(s["state"] == "ok" for s in llm["servers"]):
                    break
                time.sleep(0.2)
            assert all(s["state"] == "ok" for s in llm["servers"]), llm
    finally:
        for server in servers:
            server.stop()


def test_all_servers_down_is_503_with_retry_after(backend_settings: Settings) -> None:
    dead = ",".join(f"http://127.0.0.1:{free_port()}" for _ in range(2))
    with serve(changed(backend_settings, llm_url=dead)) as url:
        upload(url)
        response = httpx.post(f"{url}/v1/chat", json={**ask("When was it completed?"), "stream": False}, timeout=60)
        health = httpx.get(f"{url}/health", timeout=30)
    assert response.status_code == 503 and int(response.headers["Retry-After"]) > 0
    assert "no llama-server of the pool is ready" in response.json()["error"]["message"]
    assert health.status_code == 503 and len(health.json()["backends"]["llm"]["servers"]) == 2


def test_a_pool_of_different_contexts_is_refused_naming_the_difference(
    generator_model: Path, session_dir: Path, isolated_env: Path
) -> None:
    servers = [
        start_llama_server(generator_model, session_dir),
        start_llama_server(generator_model, session_dir, extra=["-c", "2048"]),
    ]

    async def check() -> None:
        pool = LlamaServerPool([s.url for s in servers])
        try:
            await pool.check()
        finally:
            await pool.aclose()

    try:
        with pytest.raises(PoolMismatch, match=r"n_ctx per slot (4096 vs 2048|2048 vs 4096)"):
            asyncio.run(check())
        env = {**_clean_env(isolated_env), "RAG_LLM_URL": ",".join(s.url for s in servers)}
        env.update(RAG_API_PORT=str(free_port()), RAG_EMBED_URL=f"http://127.0.0.1:{free_port()}")
        done = subprocess.run(
            [sys.executable, "-m", "rag.cli", "serve-api"], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1
        assert done.stderr.strip().startswith("error: the llama-servers of RAG_LLM_URL differ:"), done.stderr
        assert "n_ctx per slot" in done.stderr and "Traceback" not in done.stderr
    finally:
        for server in servers:
            server.stop()


def _busy(llama_url: str) -> bool:
    return any(s.get("is_processing") for s in httpx.get(f"{llama_url}/slots", timeout=10).json())


@pytest.fixture(scope="module")
def second_embedder(session_dir: Path) -> Iterator[Server]:
    from tests.servers import start_embedding_server

    server = start_embedding_server(session_dir, _clean_env(session_dir / "embedder-2-data"))
    yield server
    server.stop()


MANY_DOCS = {
    f"note-{i}.txt": f"Note {i} is about the river number {i}. " * 30 + f"The river {i} flows into lake {i}."
    for i in range(12)
}


def _served_by_embedder(url: str) -> dict[str, float]:
    return {labels.split('"')[1]: value for labels, value in _pool_metric(url, "rag_embedder_server_served").items()}


def test_ingestion_spreads_its_batches_over_the_embedding_pool(
    ingest_settings: Settings, embedding_server: Server, second_embedder: Server
) -> None:
    pool = f"{embedding_server.url},{second_embedder.url}"
    with serve(changed(ingest_settings, embed_url=pool, embed_batch=4)) as url:
        upload(url, MANY_DOCS)
        served = _served_by_embedder(url)
    assert served[embedding_server.url] > 0 and served[second_embedder.url] > 0, served


def test_an_embedding_server_that_is_away_leaves_the_batches_to_the_others(
    ingest_settings: Settings, embedding_server: Server
) -> None:
    away = f"http://127.0.0.1:{free_port()}"
    with serve(changed(ingest_settings, embed_url=f"{away},{embedding_server.url}", embed_batch=4)) as url:
        body = upload(url, MANY_DOCS)
        served = _served_by_embedder(url)
        failures = {labels.split('"')[1]: v for labels, v in _pool_metric(url, "rag_embedder_server_failures").items()}
        health = httpx.get(f"{url}/health", timeout=30).json()["backends"]["embedder"]
    assert len(body["results"]) == len(MANY_DOCS)
    assert served[away] == 0 and failures[away] >= 1 and served[embedding_server.url] > 0
    assert health["state"] == "ok"
    assert [s["state"] for s in health["servers"]] == ["down", "ok"]
