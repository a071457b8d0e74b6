"""SIGTERM with uploads under way, against an embedding server that takes its time: a `wait=false` job
gets the shutdown grace a request gets (it finishes when it can), and a synchronous upload cut at the end
of the grace answers its client in JSON, not with a bare-text 500."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from rag.store.catalog import DocumentCatalog
from tests.servers import Server, start_api
from tests.test_embedder_answers import answering, b64

pytestmark = pytest.mark.integration

TEXT = b"\n\n".join(f"Paragraph {i} about the harbour and its ferries.".encode() for i in range(20))


@contextmanager
def _slow_embedder(delay_s: float) -> Iterator[str]:
    """An embedding server answering each batch after `delay_s` with 8-d vectors derived from the texts."""

    def answer(path: str, body: bytes) -> bytes:
        if path == "/health":
            return b'{"status": "ok", "dimensions": 8}'
        time.sleep(delay_s)
        texts = json.loads(body)["input"]
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:8], dtype=np.uint8) - 127.5 for t in texts]
        return json.dumps({"data": [{"index": i, "embedding": b64(*row)} for i, row in enumerate(rows)]}).encode()

    with answering(answer) as url:
        yield url


def _api(tmp_path: Path, embed_url: str, grace_s: float) -> Server:
    env = {**os.environ, "RAG_EMBED_URL": embed_url, "RAG_SHUTDOWN_GRACE_S": str(grace_s)}
    return start_api(tmp_path, env, ready_path="/v1/collections")


def _stop(api: Server) -> float:
    started = time.monotonic()
    try:
        api.process.send_signal(signal.SIGTERM)
        api.process.wait(timeout=120)
    finally:
        api.stop()
    return time.monotonic() - started


def test_a_background_upload_job_gets_the_shutdown_grace(isolated_env: Path, tmp_path: Path) -> None:
    with _slow_embedder(1.5) as embed_url:
        api = _api(tmp_path, embed_url, grace_s=20)
        accepted = httpx.post(
            f"{api.url}/v1/documents", params={"wait": "false"}, files={"files": ("a.txt", TEXT)}, timeout=60
        )
        assert accepted.status_code == 202, accepted.text
        time.sleep(0.5)  # the job is embedding now
        stopped = _stop(api)
        catalog = DocumentCatalog(isolated_env / "catalog.sqlite")
        try:
            assert catalog.count_in("default", "indexed") == 1, f"the job was cut {stopped:.1f} s after SIGTERM"
        finally:
            catalog.close()


def test_a_synchronous_upload_cut_after_the_grace_gets_a_json_error(isolated_env: Path, tmp_path: Path) -> None:
    with _slow_embedder(15) as embed_url:
        api = _api(tmp_path, embed_url, grace_s=1)
        outcome: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: outcome.append(
                httpx.post(f"{api.url}/v1/documents", files={"files": ("a.txt", TEXT)}, timeout=120)
            )
        )
        sender.start()
        time.sleep(2)  # received, and waiting on the embedder
        _stop(api)
        sender.join(60)
        assert outcome, "the client got no answer"
        response = outcome[0]
        assert response.status_code == 503 and response.headers["retry-after"], response.text
        assert "shutting down" in response.json()["error"]["message"]
