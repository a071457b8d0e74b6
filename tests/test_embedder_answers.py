"""An embedding server that answers with garbage: every malformed or degenerate answer is an
UpstreamError naming what is wrong (502 at the API, nothing indexed), never a 500 or stored vectors."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from rag.clients.embedding import EmbeddingClient
from rag.core.errors import UpstreamError
from tests.chat_helpers import serve, without_backends
from tests.servers import free_port


def b64(*values: float) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


GOOD = {"data": [{"index": 0, "embedding": b64(0.6, 0.8)}, {"index": 1, "embedding": b64(0.8, 0.6)}]}
BAD_ANSWERS = {
    "not JSON": (b"<html>502 Bad Gateway</html>", "not JSON"),
    "no data": (json.dumps({"object": "list"}).encode(), "`data`"),
    "data not a list": (json.dumps({"data": "nope"}).encode(), "`data`"),
    "missing embedding": (json.dumps({"data": [{"index": 0}, {"index": 1}]}).encode(), "malformed"),
    "bad base64": (
        json.dumps({"data": [{"index": 0, "embedding": "@@@"}, {"index": 1, "embedding": "@@@"}]}).encode(),
        "malformed",
    ),
    "ragged rows": (
        json.dumps({"data": [{"index": 0, "embedding": b64(1, 0)}, {"index": 1, "embedding": b64(1, 0, 0)}]}).encode(),
        "differing",
    ),
    "too few vectors": (
        json.dumps({"data": [{"index": 0, "embedding": b64(1, 0)}]}).encode(),
        "1 vectors for 2 inputs",
    ),
    "NaN": (
        json.dumps(
            {"data": [{"index": 0, "embedding": b64(float("nan"), 1)}, {"index": 1, "embedding": b64(1, 0)}]}
        ).encode(),
        "NaN",
    ),
    "all zero": (
        json.dumps({"data": [{"index": 0, "embedding": b64(0, 0)}, {"index": 1, "embedding": b64(1, 0)}]}).encode(),
        "all-zero",
    ),
    "all identical": (
        json.dumps(
            {"data": [{"index": 0, "embedding": b64(0.6, 0.8)}, {"index": 1, "embedding": b64(0.6, 0.8)}]}
        ).encode(),
        "same vector",
    ),
}


def _client(body: bytes) -> EmbeddingClient:
    return EmbeddingClient(
        "http://embedder.invalid", model="m", transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body))
    )


@pytest.mark.parametrize(("body", "reason"), BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
def test_a_malformed_or_degenerate_answer_is_an_upstream_error_with_its_reason(body: bytes, reason: str) -> None:
    with pytest.raises(UpstreamError, match=reason):
        asyncio.run(_client(body).embed(["one text", "another text"]))


def test_a_good_answer_and_equal_vectors_for_equal_texts_pass() -> None:
    assert asyncio.run(_client(json.dumps(GOOD).encode()).embed(["a", "b"])).shape == (2, 2)
    same = {"data": [{"index": 0, "embedding": b64(0.6, 0.8)}, {"index": 1, "embedding": b64(0.6, 0.8)}]}
    assert asyncio.run(_client(json.dumps(same).encode()).embed(["a", "a"])).shape == (2, 2)


def _vectors_of_width(width: int) -> dict:
    return {"data": [{"index": 0, "embedding": b64(*([0.5] * width))}]}


def test_a_vector_of_another_width_than_the_models_is_an_upstream_error_naming_both() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok", "dimensions": 384})
        return httpx.Response(200, json=_vectors_of_width(17))

    client = EmbeddingClient("http://embedder.invalid", model="m", transport=httpx.MockTransport(answer))
    with pytest.raises(UpstreamError, match="returned 17-dimensional vectors; m gives 384-dimensional") as info:
        asyncio.run(client.embed(["a question"], kind="query"))
    assert info.value.status == 502
    with pytest.raises(UpstreamError, match="17-dimensional"):
        asyncio.run(client.embed_with_usage(["a question"]))


def test_a_server_whose_width_changes_is_an_upstream_error() -> None:
    widths = [4, 4, 3]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})  # no dimensions: the first answer's count
        return httpx.Response(200, json=_vectors_of_width(widths.pop(0)))

    client = EmbeddingClient("http://embedder.invalid", model="m", transport=httpx.MockTransport(answer))

    async def three() -> None:
        for _ in range(3):
            await client.embed(["text"])

    with pytest.raises(UpstreamError, match="returned 3-dimensional vectors; m gives 4-dimensional"):
        asyncio.run(three())


@contextmanager
def answering(answer: Callable[[str, bytes], bytes]) -> Iterator[str]:
    """An HTTP server on loopback whose every answer is `answer(path, request body)`; its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = answer(self.path, self.rfile.read(int(self.headers.get("content-length") or 0)))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)


@pytest.fixture
def two_width_embedder() -> Iterator[str]:
    """An embedding server giving documents 8-d vectors and queries 3-d ones; its /health names no width."""

    def answer(path: str, body: bytes) -> bytes:
        if path == "/health":
            return b'{"status": "ok"}'
        request = json.loads(body)
        width = 3 if request.get("input_type") == "query" else 8
        rows = [np.random.default_rng(i).normal(size=width) for i in range(len(request["input"]))]
        return json.dumps({"data": [{"index": i, "embedding": b64(*row)} for i, row in enumerate(rows)]}).encode()

    with answering(answer) as url:
        yield url


@pytest.mark.integration
def test_a_query_vector_of_another_width_is_a_502_on_chat_and_embeddings(isolated_env, two_width_embedder) -> None:
    settings = without_backends(embed_url=two_width_embedder)
    with serve(settings) as api:
        files = [("files", ("a.txt", b"First paragraph about rivers.\n\nSecond one about hills.", "text/plain"))]
        assert httpx.post(f"{api}/v1/documents", files=files, timeout=60).status_code == 200
    with serve(settings) as api:
        chat = httpx.post(
            f"{api}/v1/chat", json={"messages": [{"role": "user", "content": "Rivers?"}], "stream": False}, timeout=60
        )
        assert chat.status_code == 502, chat.text
        assert "returned 3-dimensional" in chat.json()["error"]["message"]
        embedded = httpx.post(f"{api}/v1/embeddings", json={"input": "Rivers?"}, timeout=60)
        assert embedded.status_code == 502, embedded.text
        assert "returned 3-dimensional" in embedded.json()["error"]["message"]


@pytest.fixture
def garbage_embedder() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP server answering every request with the last body in its list (a broken embedder)."""
    answers = [BAD_ANSWERS["not JSON"][0]]
    with answering(lambda path, _: answers[-1] if path != "/health" else b'{"status": "ok"}') as url:
        yield url, answers


@pytest.mark.integration
@pytest.mark.parametrize("case", ["not JSON", "no data", "ragged rows", "bad base64", "all zero", "all identical"])
def test_the_api_answers_502_with_the_reason_and_indexes_nothing(isolated_env, garbage_embedder, case: str) -> None:
    url, answers = garbage_embedder
    answers.append(BAD_ANSWERS[case][0])
    with serve(without_backends(embed_url=url)) as api:
        files = [("files", ("a.txt", b"First paragraph about rivers.\n\nSecond one about hills.", "text/plain"))]
        upload = httpx.post(f"{api}/v1/documents", files=files, timeout=60)
        assert upload.status_code == 502, upload.text
        error = upload.json()["error"]
        assert error["code"] == "upstream_error" and error["message"].startswith("embedding server"), error
        listed = httpx.get(f"{api}/v1/documents", timeout=30).json()
        assert all(d["state"] != "indexed" for d in listed["documents"])
        chat = httpx.post(
            f"{api}/v1/chat", json={"messages": [{"role": "user", "content": "Rivers?"}], "stream": False}, timeout=60
        )
        assert chat.status_code in (404, 502), chat.text  # nothing indexed: no collection yet, or the query's vector
