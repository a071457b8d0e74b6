"""POST /v1/embeddings against hostile and sloppy clients: every refusal is a 4xx in the API's error shape,
sent before the embedding server is asked (nothing listens at its address here), never a 500."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rag.clients.embedding import EmbeddingClient
from rag.core.config import Settings
from rag.core.errors import EmbedderUnavailable
from rag.servers.embedding import DISCONNECT_POLL_S
from tests.chat_helpers import serve
from tests.conftest import SUITE_EMBEDDER
from tests.servers import Server, free_port, start_embedding_server

JSON = {"content-type": "application/json"}


@pytest.fixture
def api() -> Iterator[str]:
    """The API with nothing at its embedding server's (or llama-server's) address."""
    settings = Settings(embed_url=f"http://127.0.0.1:{free_port()}", llm_url=f"http://127.0.0.1:{free_port()}")
    with serve(settings) as url:
        yield url


def post(url: str, body: bytes, headers: dict[str, str] = JSON) -> httpx.Response:
    return httpx.post(f"{url}/v1/embeddings", content=body, headers=headers, timeout=60)


def refused(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert error["code"] and error["message"]
    return error


@pytest.mark.parametrize("model", ["\ud800", "a\udfffb"])
def test_a_model_name_with_a_lone_surrogate_is_a_404_not_a_500(api: str, model: str):
    error = refused(post(api, json.dumps({"input": "hello", "model": model}).encode()), 404)
    assert error["code"] == "model_not_found"


def test_a_huge_model_name_is_not_echoed_whole(api: str):
    response = post(api, json.dumps({"input": "hello", "model": "m" * 100_000}).encode())
    refused(response, 404)
    assert len(response.content) < 2_000


@pytest.mark.parametrize(
    "body",
    [
        b'{"input": "\xff\xfe"}',  # not UTF-8
        b"[" * 100_000 + b"]" * 100_000,  # deeper than Python's JSON parser goes
        b'{"input": "hi", "dimensions": 1' + b"0" * 5000 + b"}",  # an integer over Python's digit limit
    ],
    ids=["invalid-utf8", "nested-100k", "5000-digit-int"],
)
def test_an_unparsable_body_is_a_400_in_the_error_shape(api: str, body: bytes):
    assert refused(post(api, body), 400)["code"] == "invalid_request"


@pytest.mark.parametrize("item", [b"1", b"{}", b"null"])
def test_a_million_wrong_items_give_one_short_error(api: str, item: bytes):
    # 2 MB of `[1,1,1,...]` used to come back as a 60 MB message, one problem per item, after seconds
    # of CPU on the event loop that every other request waited for.
    body = b'{"input":[' + b",".join([item] * 400_000) + b"]}"
    response = post(api, body)
    refused(response, 400)
    assert len(response.content) < 5_000


@pytest.mark.parametrize(
    "payload",
    [
        {"input": "\ud800"},
        {"input": ["ok", 1]},
        {"input": [[1, 2]]},
        {"input": {"text": "x"}},
        {"input": None},
        {"input": "x", "encoding_format": "float16"},
        {"input": "x", "dimensions": 0},
        {"input": "x", "dimensions": "many"},
        {"input": "x", "model": 5},
    ],
)
def test_wrong_types_are_400_before_the_embedder(api: str, payload: dict):
    assert refused(post(api, json.dumps(payload).encode()), 400)["code"] == "invalid_request"


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/x-www-form-urlencoded"}])
def test_a_body_that_is_not_json_is_a_400(api: str, headers: dict[str, str]):
    assert refused(post(api, b"input=hello", headers), 400)["code"] == "invalid_request"


def test_a_chunked_body_over_the_limit_is_a_413(api: str):
    def chunks() -> Iterator[bytes]:
        yield b'{"input": ["'
        for _ in range(300):
            yield b"x" * 10_000
        yield b'"]}'

    response = httpx.post(f"{api}/v1/embeddings", content=chunks(), headers=JSON, timeout=60)
    assert refused(response, 413)["code"] == "too_large"


# --- the embedding server under clients that go away, and a stop while it is busy ---------------------

BUSY = [f"word{i} " * 300 for i in range(512)]  # 512 texts over the model's 256 tokens: ~17 s on 2 cores


@pytest.fixture
def embedder(tmp_path: Path) -> Iterator[Server]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(RAG_DATA_DIR=str(tmp_path / "data"), RAG_EMBED_MODEL=SUITE_EMBEDDER)  # its 256 tokens
    server = start_embedding_server(tmp_path, env)
    try:
        yield server
    finally:
        server.stop()


def _busy(url: str, clients: int) -> list[threading.Thread]:
    """`clients` requests of BUSY texts each, sent and left running in threads."""

    def send() -> None:
        try:
            httpx.post(f"{url}/v1/embeddings", json={"input": BUSY}, timeout=300)
        except httpx.HTTPError:
            pass

    threads = [threading.Thread(target=send, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.integration
def test_the_embedding_server_stopped_while_busy_exits_within_seconds(embedder: Server):
    _busy(embedder.url, 3)
    time.sleep(3)
    os.killpg(embedder.pid, signal.SIGTERM)
    try:
        embedder.process.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail("the embedding server still runs 10 s after SIGTERM")


@pytest.mark.integration
def test_work_of_clients_that_went_away_is_dropped(embedder: Server):
    with httpx.Client(timeout=1.0) as client:
        for _ in range(3):
            with pytest.raises(httpx.ReadTimeout):
                client.post(f"{embedder.url}/v1/embeddings", json={"input": BUSY})
    time.sleep(2 * DISCONNECT_POLL_S)  # the server notices the clients are gone
    started = time.monotonic()
    response = httpx.post(
        f"{embedder.url}/v1/embeddings", json={"input": [f"batch {i}" for i in range(32)]}, timeout=60
    )
    assert response.status_code == 200
    assert time.monotonic() - started < 5, "a batch waited for work nobody will read"


@pytest.mark.integration
def test_a_query_does_not_wait_behind_an_ingests_batches(embedder: Server):
    _busy(embedder.url, 2)
    time.sleep(2)
    started = time.monotonic()
    response = httpx.post(f"{embedder.url}/v1/embeddings", json={"input": "When was the lighthouse built?"}, timeout=60)
    assert response.status_code == 200
    assert time.monotonic() - started < 3, "a query waited behind 1,024 long texts"


def test_a_read_timeout_is_not_sent_again():
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        raise httpx.ReadTimeout("the embedding server is busy", request=request)

    async def embed() -> None:
        client = EmbeddingClient("http://embedder", model="m", transport=httpx.MockTransport(handler))
        try:
            with pytest.raises(EmbedderUnavailable):
                await client.embed(["hello"])
        finally:
            await client.aclose()

    asyncio.run(embed())
    assert len(sent) == 1


@pytest.mark.integration
@pytest.mark.parametrize(
    "payload",
    [{"input": "\ud800"}, {"input": ["ok", "a\udfffb"]}, {"input": [1, 2]}],
    ids=["surrogate", "surrogate-in-list", "token-ids"],
)
def test_the_embedding_server_refuses_bad_input_with_a_400_in_openais_shape(embedding_server: Server, payload: dict):
    response = httpx.post(
        f"{embedding_server.url}/v1/embeddings", content=json.dumps(payload).encode(), headers=JSON, timeout=60
    )
    assert response.status_code == 400 and response.json()["error"]["message"]
