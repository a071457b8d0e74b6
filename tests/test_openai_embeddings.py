"""POST /v1/embeddings on the API with the official openai SDK and langchain-openai, against the real
embedding server: one base URL serves chat, models and embeddings."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from rag.core.config import Settings
from tests.chat_helpers import changed, serve
from tests.servers import Server, free_port

pytestmark = pytest.mark.integration

TEXTS = ["The Eiffel Tower was completed in 1889.", "Paris is the capital of France.", "Bananas are yellow."]


@pytest.fixture
def api(ingest_settings: Settings) -> Iterator[str]:
    with serve(ingest_settings) as url:
        yield url


@pytest.fixture
def no_embedder(ingest_settings: Settings) -> Iterator[str]:
    """The API with nothing at its embedding server's address, and at most 2 inputs a request."""
    settings = changed(
        ingest_settings,
        embed_url=f"http://127.0.0.1:{free_port()}",
        embed_max_inputs=2,
        max_message_chars=100,
        max_request_bytes=4096,
    )
    with serve(settings) as url:
        yield url


def client(url: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120, **kwargs)


def direct(server: Server, texts: list[str]) -> np.ndarray:
    """The embedding server's own vectors, asked of it directly."""
    response = httpx.post(f"{server.url}/v1/embeddings", json={"input": texts}, timeout=120)
    response.raise_for_status()
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_listed_embedding_model_embeds_like_the_embedding_server(api: str, embedding_server: Server):
    sdk = client(api)
    listed = [m for m in sdk.models.list().data if m.model_extra["rag"]["role"] == "embeddings"]
    assert len(listed) == 1
    response = sdk.embeddings.create(model=listed[0].id, input=TEXTS)  # the SDK asks for base64
    assert response.model == listed[0].id and [d.index for d in response.data] == [0, 1, 2]
    got = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert got.shape == (3, 384)
    assert cosines(got, direct(embedding_server, TEXTS)).min() > 0.999
    assert response.usage.prompt_tokens == response.usage.total_tokens > 0
    assert response.usage.model_extra["truncated_inputs"] == 0


def test_an_input_longer_than_the_model_reads_is_counted_as_truncated(api: str, ingest_settings: Settings):
    long = "lighthouse keeper " * 400  # ~800 tokens; MiniLM reads 256
    usage = client(api).embeddings.create(model=ingest_settings.embed_model, input=[long, "short"]).usage
    assert usage.model_extra["truncated_inputs"] == 1 and usage.prompt_tokens <= 256 + 3


def test_float_and_base64_give_the_same_vectors(api: str, ingest_settings: Settings):
    as_float = client(api).embeddings.create(model=ingest_settings.embed_model, input=TEXTS[0], encoding_format="float")
    body = {"model": ingest_settings.embed_model, "input": TEXTS[0], "encoding_format": "base64"}
    as_base64 = httpx.post(f"{api}/v1/embeddings", json=body, timeout=120).json()["data"][0]["embedding"]
    assert isinstance(as_base64, str) and len(as_float.data) == 1
    decoded = np.frombuffer(base64.b64decode(as_base64), dtype="<f4")
    assert np.allclose(decoded, np.array(as_float.data[0].embedding, dtype=np.float32))


def test_dimensions_other_than_the_models_own_are_refused(api: str, ingest_settings: Settings):
    model = ingest_settings.embed_model
    assert len(client(api).embeddings.create(model=model, input="x y", dimensions=384).data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as caught:
        client(api).embeddings.create(model=model, input="x y", dimensions=256)
    assert "384" in caught.value.message


def test_an_unknown_model_is_a_404_in_openais_shape(api: str):
    with pytest.raises(openai.NotFoundError) as caught:
        client(api).embeddings.create(model="text-embedding-3-small", input="hello")
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    assert "text-embedding-3-small" in caught.value.message


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({"input": ["a", "b", "c"]}, 413, "too_many_inputs"),
        ({"input": "x" * 101}, 413, "limit_exceeded"),
        ({"input": ["x " * 2500]}, 413, "too_large"),  # over RAG_MAX_REQUEST_BYTES
        ({"input": ["a", ""]}, 400, "invalid_request"),
        ({"input": []}, 400, "invalid_request"),
        ({"input": [[1, 2, 3]]}, 400, "invalid_request"),
        ({"input": "a", "model": "nope"}, 404, "model_not_found"),
    ],
)
def test_bad_input_is_refused_before_the_embedder(no_embedder: str, payload: dict, status: int, code: str):
    # Nothing listens at the embedding server's address: a refusal, not a 503, shows no call was made.
    response = httpx.post(f"{no_embedder}/v1/embeddings", json=payload, timeout=30)
    assert response.status_code == status and response.json()["error"]["code"] == code
    assert "RAG_" in response.json()["error"]["message"] or status != 413


def test_the_embedder_down_is_a_503_with_retry_after(no_embedder: str):
    response = httpx.post(f"{no_embedder}/v1/embeddings", json={"input": "hello"}, timeout=30)
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"]["code"] == "embedder_unavailable"


def test_the_api_key_guards_embeddings_and_metrics_count_them(ingest_settings: Settings):
    key = "s3cret-key"
    with serve(changed(ingest_settings, api_key=key)) as url:
        with pytest.raises(openai.AuthenticationError):
            client(url).embeddings.create(model=ingest_settings.embed_model, input="hello")
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        assert sdk.embeddings.create(model=ingest_settings.embed_model, input="hello").data
        metrics = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {key}"}).text
    assert 'rag_http_requests_total{method="POST",route="/v1/embeddings",status="200"} 1.0' in metrics
    assert 'rag_http_requests_total{method="POST",route="/v1/embeddings",status="401"} 1.0' in metrics


def test_langchain_openai_embeds_through_the_api(api: str, ingest_settings: Settings, embedding_server: Server):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        base_url=f"{api}/v1",
        api_key="unused",
        model=ingest_settings.embed_model,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    documents = np.array(embeddings.embed_documents(TEXTS), dtype=np.float32)
    query = np.array([embeddings.embed_query(TEXTS[1])], dtype=np.float32)
    assert cosines(documents, direct(embedding_server, TEXTS)).min() > 0.999
    assert cosines(query, documents[1:2])[0] > 0.999
