"""Unit tests of the embedding pool (rag.clients.embedding_pool) over stand-in embedding servers: every
batch goes to members of one model, a member serving another model of the same dimension is kept out."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import numpy as np
import pytest

from rag.clients.embedding_pool import EmbeddingPool
from rag.core.embeddings_api import EmbeddingsUsage, embeddings_response

MINILM, E5 = "all-MiniLM-L6-v2", "multilingual-e5-small"


class Embedders:
    """Embedding servers by host, each serving `models[host]` (384-d vectors); counts the batches each served."""

    def __init__(self, models: dict[str, str]) -> None:
        self.models = models
        self.batches: Counter[str] = Counter()

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        host, model = request.url.host, self.models[request.url.host]
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok", "model": model, "device": "cpu", "dimensions": 384})
        texts = json.loads(request.content)["input"]
        self.batches[host] += 1
        vectors = np.random.default_rng(len(texts)).normal(size=(len(texts), 384)).astype(np.float32)
        usage = EmbeddingsUsage(prompt_tokens=len(texts), total_tokens=len(texts))
        return httpx.Response(200, json=embeddings_response(vectors, "base64", model, usage).model_dump())


@pytest.mark.parametrize("other", ["a", "b"])
def test_a_member_serving_another_model_of_the_same_dimension_gets_no_batch(other: str) -> None:
    ours = "b" if other == "a" else "a"
    servers = Embedders({ours: MINILM, other: E5})

    async def run() -> dict[str, Any]:
        pool = EmbeddingPool(["http://a:1", "http://b:1"], model=MINILM, transport=servers.transport())
        try:
            await asyncio.gather(*(pool.embed([f"text {i}", f"other {i}"]) for i in range(8)))
            return await pool.health()
        finally:
            await pool.aclose()

    health = asyncio.run(run())
    assert servers.batches == {ours: 8}, "one collection, one model"
    assert health["state"] == "ok"
    states = {s["url"]: s for s in health["servers"]}
    assert states[f"http://{ours}:1"]["state"] == "ok" and states[f"http://{other}:1"]["state"] == "refused"
    assert f"{E5} vs {MINILM}" in states[f"http://{other}:1"]["reason"]
