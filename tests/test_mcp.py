"""The MCP server, driven by the SDK's own client over both transports against the real stack:
Streamable HTTP at the API's /mcp (behind the key) and stdio (`rag mcp`, through the API or on the store)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from rag.answering.prompt import no_sources_answer
from rag.core.config import Settings
from tests.chat_helpers import DOCS, changed, serve, upload
from tests.servers import Server, free_port, start_api

pytestmark = pytest.mark.integration

KEY = "mcp-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def http_client(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=timeout) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
    ):
        yield client


def stdio_params(env: dict[str, str], *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "rag.cli", "mcp", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )


async def text_of(client: Client, uri: str) -> str:
    result = await client.read_resource(uri)
    return "".join(c.text for c in result.contents)


async def check_the_tools(client: Client) -> None:
    """What every transport must do over the three test documents."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"search", "ask", "list_documents", "list_collections"}
    assert tools["search"].input_schema["required"] == ["query"]

    found = (
        await client.call_tool("search", {"query": "How tall is the Eiffel Tower?", "top_k": 2})
    ).structured_content
    assert found["query"] == "How tall is the Eiffel Tower?"
    assert len(found["results"]) == 2
    best = found["results"][0]
    assert best["document"] == "eiffel.txt" and "330 metres" in best["text"] and 0 < best["score"] <= 1

    progress: list[tuple[float, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    answer = (
        await client.call_tool("ask", {"question": "How tall is the Eiffel Tower?"}, progress_callback=on_progress)
    ).structured_content
    assert answer["answer"].strip() and answer["no_sources"] is None
    assert answer["sources"][0]["source"] == "eiffel.txt"
    assert any(c["kind"] == "attributed" and c["source"] == "eiffel.txt" for c in answer["citations"]), answer
    assert progress and "".join(m or "" for _, m in progress) == answer["answer"], "progress carries the answer's text"

    off_topic = (await client.call_tool("ask", {"question": "What is the recipe for Sachertorte?"})).structured_content
    assert off_topic["answer"] == no_sources_answer(off_topic["collection"], "", ["Sachertorte"])
    assert off_topic["citations"] == [] and off_topic["sources"] == [] and off_topic["no_sources"] == "not_mentioned"

    documents = (await client.call_tool("list_documents", {})).structured_content
    assert documents["total"] == 3
    eiffel = next(d for d in documents["documents"] if d["name"] == "eiffel.txt")
    text = await text_of(client, eiffel["uri"])
    assert text == DOCS["eiffel.txt"], "the resource is the document's text, chunks stitched without overlap"

    collections = (await client.call_tool("list_collections", {})).structured_content
    assert collections["collections"] == [{"name": "default", "documents": 3}]


def test_over_http_the_tools_search_and_answer_with_citations(backend_settings: Settings):
    with serve(changed(backend_settings, api_key=KEY)) as url:
        upload(url, headers=AUTH)

        async def main() -> None:
            async with http_client(url, AUTH) as client:
                await check_the_tools(client)

        anyio.run(main)


def test_over_http_a_client_without_the_key_gets_401(backend_settings: Settings):
    with serve(changed(backend_settings, api_key=KEY)) as url:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}
        for auth in ({}, {"Authorization": "Bearer wrong"}):
            response = httpx.post(f"{url}/mcp", json=initialize, headers={**headers, **auth}, timeout=60)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "unauthorized"
        assert httpx.post(f"{url}/mcp", json=initialize, headers={**headers, **AUTH}, timeout=60).status_code == 200

        async def without_key() -> None:
            async with http_client(url) as client:
                await client.list_tools()

        with pytest.raises(BaseExceptionGroup) as failed:  # the SDK's transport task fails on the 401
            anyio.run(without_key)
        assert failed.group_contains(MCPError, match="error response")


@pytest.mark.parametrize(
    "tool, arguments, field",
    [
        ("search", {}, "query"),
        ("search", {"query": "x" * 101}, "query"),
        ("search", {"query": "Eiffel", "top_k": 0}, "top_k"),
        ("ask", {"question": "Eiffel?", "history": [{"role": "user", "content": "hi"}] * 5}, "history"),
        ("ask", {"question": "Eiffel?", "history": [{"role": "user", "content": "y" * 201}]}, "history.0.content"),
        ("ask", {"question": "x" * 101}, "question"),
        ("list_documents", {"limit": 100000}, "limit"),
    ],
)
def test_missing_or_oversized_arguments_are_a_json_rpc_error_naming_the_field(
    backend_settings: Settings, tool: str, arguments: dict[str, Any], field: str
):
    settings = changed(backend_settings, max_question_chars=100, max_messages=5, max_message_chars=200)
    with serve(settings) as url:

        async def main() -> None:
            async with http_client(url) as client:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool(tool, arguments)
                assert refused.value.error.code == -32602
                assert field in refused.value.error.data["fields"]
                assert field in refused.value.error.message

        anyio.run(main)


def test_an_unknown_collection_is_an_error_naming_the_known_ones(backend_settings: Settings):
    with serve(backend_settings) as url:
        upload(url)

        async def main() -> None:
            async with http_client(url) as client:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("search", {"query": "Eiffel", "collection": "nope"})
                assert refused.value.error.code == -32602 and "default" in refused.value.error.message

        anyio.run(main)


def ingest_docs(env: dict[str, str], folder: Path) -> None:
    """Index the three test documents with the `ingest` CLI (on the store: no API runs)."""
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", str(folder)],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_over_stdio_without_an_api_it_opens_the_store(backend_env: dict[str, str], tmp_path: Path):
    env = {**backend_env, "RAG_API_PORT": str(free_port())}  # nothing listens there
    ingest_docs(env, tmp_path / "docs")
    log = tmp_path / "mcp.log"

    async def main() -> None:
        with log.open("w") as errlog:
            async with Client(stdio_client(stdio_params(env), errlog=errlog)) as client:
                await check_the_tools(client)

    anyio.run(main)
    assert f"rag mcp: on the store in {env['RAG_DATA_DIR']}" in log.read_text()


def test_over_stdio_through_the_api_no_http_request_is_logged(ingest_env: dict[str, str], tmp_path: Path):
    api = start_api(tmp_path, ingest_env, ready_path="/v1/collections")
    env = {**ingest_env, "RAG_API_HOST": "127.0.0.1", "RAG_API_PORT": api.url.rsplit(":", 1)[1]}
    log = tmp_path / "mcp.log"

    async def main() -> None:
        with log.open("w") as errlog:
            async with Client(stdio_client(stdio_params(env), errlog=errlog)) as client:
                for _ in range(3):
                    await client.call_tool("list_collections", {})

    try:
        anyio.run(main)
    finally:
        api.stop()
    said = log.read_text()
    assert f"rag mcp: via the API at {api.url}" in said
    assert "HTTP Request:" not in said, said  # httpx's INFO line per request stays out of the client's log


def test_over_stdio_the_server_names_its_version(ingest_env: dict[str, str]):
    from rag.core.provenance import package_version

    env = {**ingest_env, "RAG_API_PORT": str(free_port())}

    async def main() -> None:
        async with Client(stdio_client(stdio_params(env))) as client:
            info = client.server_info
            assert info is not None and info.name == "rag"
            assert info.version == package_version() and info.version not in ("", "unknown")

    anyio.run(main)


def test_over_stdio_with_an_api_running_it_goes_through_the_api(
    backend_settings: Settings, backend_env: dict[str, str], tmp_path: Path
):
    port = free_port()
    settings = changed(backend_settings, api_key=KEY, api_port=port)
    env = {**backend_env, "RAG_API_PORT": str(port), "RAG_API_KEY": KEY}
    log = tmp_path / "mcp.log"
    with serve(settings, port=port) as url:
        upload(url, headers=AUTH)

        async def main() -> None:
            with log.open("w") as errlog:
                async with Client(stdio_client(stdio_params(env), errlog=errlog)) as client:
                    await check_the_tools(client)
                    with pytest.raises(MCPError) as refused:  # the API's own JSON-RPC error, passed through
                        await client.call_tool("search", {"query": ""})
                    assert "query" in refused.value.error.data["fields"]

        anyio.run(main)
    said = log.read_text()
    assert f"rag mcp: via the API at {url}" in said
    assert "HTTP Request:" not in said  # no httpx line per request to the API in the client's log


def _slot_busy(llama_url: str) -> bool:
    return any(s["is_processing"] for s in httpx.get(f"{llama_url}/slots", timeout=10).json())


def test_a_stdio_client_that_disappears_stops_the_answer_being_generated(
    backend_env: dict[str, str], endless_llama: Server, tmp_path: Path
):
    env = {
        **backend_env,
        "RAG_API_PORT": str(free_port()),
        "RAG_LLM_URL": endless_llama.url,
        "RAG_COMPLETION_MAX_TOKENS": "1500",
        "RAG_COMPLETION_STOP_LOOPS": "false",  # the endless line repeats itself
        "RAG_COMPLETION_SPANS": "off",  # streamed as generated, so the client sees its progress
        "PYTHONPATH": str(ROOT),
    }
    ingest_docs(env, tmp_path / "docs")
    with (tmp_path / "mcp.log").open("w") as errlog:
        server = subprocess.Popen(
            [sys.executable, "-m", "rag.cli", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=env,
            cwd=ROOT,
            text=True,
        )
    try:
        send = _json_rpc(server)
        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "gone", "version": "1"},
                },
            }
        )
        assert _read(server)["id"] == 1
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "ask",
                    "arguments": {"question": "How tall is the Eiffel Tower?"},
                    "_meta": {"progressToken": 7},
                },
            }
        )
        first = _read(server)
        assert first.get("method") == "notifications/progress", first  # the answer is being generated
        assert _slot_busy(endless_llama.url)
        server.stdin.close()  # the client is gone
        gone = time.monotonic()
        assert server.wait(timeout=60) is not None, "the server stops when its client goes away"
        left = time.monotonic()
        while _slot_busy(endless_llama.url) and time.monotonic() - left < 30:
            time.sleep(0.1)
        print(f"slot freed {time.monotonic() - gone:.1f} s after the client left")
        assert not _slot_busy(endless_llama.url), "the generation stopped with it (1,500 tokens take a minute)"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def _json_rpc(process: subprocess.Popen) -> Any:
    import json

    def send(message: dict[str, Any]) -> None:
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()

    return send


def _read(process: subprocess.Popen) -> dict[str, Any]:
    import json

    line = process.stdout.readline()
    assert line, "the server closed its output"
    return json.loads(line)


def _open_session(client: httpx.Client, url: str) -> httpx.Response:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    return client.post(f"{url}/mcp", json=initialize, headers={"Accept": "application/json, text/event-stream"})


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_over_http_sessions_are_bounded_and_idle_ones_are_closed(ingest_env: dict[str, str], tmp_path: Path):
    env = {**ingest_env, "RAG_MCP_MAX_SESSIONS": "60", "RAG_MCP_SESSION_IDLE_S": "3"}
    api = start_api(tmp_path, env, ready_path="/v1/collections")
    try:
        with httpx.Client(timeout=60) as client:
            first = [_open_session(client, api.url) for _ in range(100)]
            full_mb = _rss_mb(api.pid)
            assert [r.status_code for r in first] == [200] * 60 + [503] * 40
            assert all(int(r.headers["Retry-After"]) > 0 for r in first[60:])
            time.sleep(5)  # every session idle past RAG_MCP_SESSION_IDLE_S: the SDK closed them
            gone = first[0].headers["mcp-session-id"]
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            headers = {"Accept": "application/json, text/event-stream", "mcp-session-id": gone}
            assert client.post(f"{api.url}/mcp", json=listing, headers=headers).status_code == 404
            again = [_open_session(client, api.url) for _ in range(100)]
            assert [r.status_code for r in again] == [200] * 60 + [503] * 40
            # The closed sessions' memory serves the new ones: the API does not grow by another 60 sessions.
            assert _rss_mb(api.pid) - full_mb < 15, (full_mb, _rss_mb(api.pid))
    finally:
        api.stop()
