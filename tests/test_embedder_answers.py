"""An embedding server that answers with garbage: every malformed or degenerate answer is an
UpstreamError naming what is wrong (502 at the API, nothing indexed), never a 500 or stored vectors."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
from collections.abc import Iterator

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


@pytest.fixture
def garbage_embedder() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP server answering every request with the last body in its list (a broken embedder)."""
    answers = [BAD_ANSWERS["not JSON"][0]]

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answers[-1] if self.path != "/health" else b'{"status": "ok"}')

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", answers
    server.shutdown()
    thread.join(10)


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
