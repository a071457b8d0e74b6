"""Hostile requests to the API: every bound holds before costly work, and every refusal is a clear 4xx.

The API runs over real HTTP with its backends away (nothing listens on their ports): a refusal that
comes back 4xx proves that nothing reached a backend, and a 503 shows what a client gets while one is
down.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests import hostile
from tests.chat_helpers import serve, without_backends

pytestmark = pytest.mark.integration

KEY = "k3y"
CHAT_ROUTES = ("/v1/chat", "/v1/chat/completions")


@pytest.fixture
def api(isolated_env) -> Iterator[str]:
    with serve(without_backends()) as url:
        yield url


def _post(url: str, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)


def _body(messages: list[dict[str, str]]) -> bytes:
    return json.dumps({"messages": messages, "stream": False}).encode()


@pytest.mark.parametrize("path", CHAT_ROUTES)
def test_a_million_wrong_messages_give_one_short_error(api: str, path: str):
    # 2 MB of `[1,1,1,...]` cost seconds of validation on the event loop, one problem per item.
    body = b'{"messages":[' + b",".join([b"1"] * 400_000) + b"]}"
    response = _post(api, path, body)
    assert response.status_code == 400 and len(response.content) < 5_000, response.content[:300]


@pytest.mark.parametrize("path", CHAT_ROUTES)
def test_a_40_mb_question_is_refused_while_it_streams(api: str, path: str):
    total = 40 << 20

    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(total >> 16):
            yield b"q" * (1 << 16)
        yield b'"}]}'

    status, sent, answer = hostile.send_until_answered(
        api, path, {"content-type": "application/json", "transfer-encoding": "chunked"}, _chunked(chunks())
    )
    assert status == 413, answer[:500]
    assert b"RAG_MAX_REQUEST_BYTES" in answer
    assert sent < 8 << 20, f"the client sent {sent:,} bytes before the 413"


def test_a_million_messages_is_refused_from_the_headers(api: str):
    one = b'{"role": "user", "content": "hi"}, '
    length = 16 + len(one) * 1_000_000
    status, sent, answer = hostile.send_until_answered(
        api,
        "/v1/chat",
        {"content-type": "application/json", "content-length": str(length)},
        (one * 1000 for _ in range(1000)),
    )
    assert status == 413 and b"too_large" in answer
    assert sent < 8 << 20


@pytest.mark.parametrize("path", CHAT_ROUTES)
@pytest.mark.parametrize(
    ("messages", "setting"),
    [
        ([{"role": "user", "content": "hi"}] * 1001, "RAG_MAX_MESSAGES"),
        ([{"role": "user", "content": "q" * 32_001}], "RAG_MAX_QUESTION_CHARS"),
        (
            [{"role": "assistant", "content": "a" * 64_001}, {"role": "user", "content": "and?"}],
            "RAG_MAX_MESSAGE_CHARS",
        ),
    ],
)
def test_messages_over_a_bound_are_413_naming_it(api: str, path: str, messages: list[dict[str, str]], setting: str):
    response = _post(api, path, _body(messages))
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded" and setting in error["message"]


@pytest.mark.parametrize("path", CHAT_ROUTES)
def test_a_lone_surrogate_is_a_400_not_a_500(api: str, path: str):
    response = _post(api, path, b'{"messages": [{"role": "user", "content": "broken \\ud800 text"}], "stream": false}')
    assert response.status_code == 400, response.text
    assert "surrogate" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", CHAT_ROUTES)
def test_a_backend_that_is_down_is_503_with_retry_after(api: str, path: str):
    response = _post(api, path, _body([{"role": "user", "content": "Where is the tower?"}]))
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) > 0
    health = httpx.get(f"{api}/health", timeout=30)
    assert health.status_code == 503 and int(health.headers["retry-after"]) > 0


def test_docs_pages_need_no_cdn_and_the_schema_is_behind_the_key(isolated_env):
    with serve(without_backends(api_key=KEY)) as url:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert httpx.get(f"{url}{path}", timeout=30).status_code == 404, path
        assert httpx.get(f"{url}/v1/openapi.json", timeout=30).status_code == 401
        schema = httpx.get(f"{url}/v1/openapi.json", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert schema.status_code == 200 and "/v1/chat" in schema.json()["paths"]
        page = httpx.get(f"{url}/", timeout=30).text
        assert "cdn" not in page.lower()


def test_an_upload_over_the_limit_is_answered_while_the_body_still_streams(isolated_env):
    limit = 4 << 20
    total = 128 << 20

    def chunks() -> Iterator[bytes]:
        yield b'--b0undary\r\nContent-Disposition: form-data; name="files"; filename="endless.txt"\r\n\r\n'
        for _ in range(total >> 17):
            yield b"z" * (1 << 17)
        yield b"\r\n--b0undary--\r\n"

    with serve(without_backends(max_upload_bytes=limit)) as url:
        status, sent, answer = hostile.send_until_answered(
            url,
            "/v1/documents",
            {"content-type": "multipart/form-data; boundary=b0undary", "transfer-encoding": "chunked"},
            _chunked(chunks()),
        )
        assert status == 413, answer[:500]
        # What the client could send is the limit plus what loopback's socket buffers took and the server
        # never read (the receiver's buffer grows to tcp_rmem's maximum, 32 MiB on many Linux machines).
        assert sent < total // 2, f"the client sent {sent:,} of {total:,} bytes before the 413"
        assert httpx.get(f"{url}/v1/documents", timeout=30).json()["documents"] == []


def test_a_client_that_keeps_sending_after_the_413_is_cut_off(isolated_env):
    """The server closes at the limit instead of reading (and discarding) the rest of the body."""
    import socket

    limit, total = 1 << 20, 64 << 20
    with serve(without_backends(max_upload_bytes=limit)) as url:
        port = int(url.rsplit(":", 1)[1])
        sent = 0
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: multipart/form-data; boundary=b0undary\r\n\r\n"
            )
            chunks = _chunked(
                iter(
                    [b'--b0undary\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n\r\n']
                    + [b"z" * (1 << 16)] * (total >> 16)
                )
            )
            with pytest.raises(OSError):
                for chunk in chunks:
                    sock.sendall(chunk)
                    sent += len(chunk)
                raise AssertionError("the server read the whole body")
        assert sent < total // 2, f"{sent:,} of {total:,} bytes went through before the server closed"


def _chunked(chunks: Iterator[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        yield b"%x\r\n%s\r\n" % (len(chunk), chunk)
    yield b"0\r\n\r\n"


def test_the_embedding_client_sends_a_lone_surrogate_as_a_replacement_character():
    seen: list[dict] = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.5 + i]} for i in range(len(body["input"]))]
        return httpx.Response(
            200, json={"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        )

    from rag.clients.embedding import EmbeddingClient

    async def go() -> list[list[float]]:
        client = EmbeddingClient("http://embedder.invalid", model="m", transport=httpx.MockTransport(reply))
        try:
            return (await client.embed(["broken \ud800 text", "fine"])).tolist()
        finally:
            await client.aclose()

    assert asyncio.run(go()) == [[0.5, 0.5], [0.5, 1.5]]
    assert "\ud800" not in seen[0]["input"][0] and "\ufffd" in seen[0]["input"][0]


def test_the_embedding_client_retries_a_loading_server_and_then_says_it_is_not_ready():
    calls: list[int] = []

    def loading_then_ready(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":  # asked once, for the model's width: not an embedding call
            return httpx.Response(200, json={"status": "ok", "dimensions": 2})
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(503, json={"error": {"message": "loading"}})
        data = [{"object": "embedding", "index": 0, "embedding": [1.0, 0.0]}]
        return httpx.Response(200, json={"object": "list", "data": data, "model": "m"})

    def always_loading(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok", "dimensions": 2})
        calls.append(1)
        return httpx.Response(503, json={"error": {"message": "loading"}})

    from rag.clients.embedding import EmbeddingClient
    from rag.core.errors import EmbedderUnavailable

    async def embed(reply: Any) -> list[list[float]]:
        client = EmbeddingClient("http://embedder.invalid", model="m", transport=httpx.MockTransport(reply))
        try:
            return (await client.embed(["text"])).tolist()
        finally:
            await client.aclose()

    assert asyncio.run(embed(loading_then_ready)) == [[1.0, 0.0]] and len(calls) == 2
    calls.clear()
    with pytest.raises(EmbedderUnavailable, match="not ready"):
        asyncio.run(embed(always_loading))
    assert len(calls) == 3  # the first try and two retries
