"""`POST /v1/embeddings`: the embedding server's model behind the API's own base URL.

OpenAI clients take one base URL (chat front-ends, langchain's `OpenAIEmbeddings`): `GET /v1/models` lists
the embedding model, and this route serves it, forwarded through the embedding client. The request is
bounded before it leaves the API (body bytes, number of inputs, characters of each); `model` must be the
embedding model's name (or left out), another is a 404 in OpenAI's shape; `dimensions` is accepted only
when it is the model's own, since the model cannot shorten its vectors. Token arrays as input are refused.
`input_type` (`query`, the default, or `passage`) is ours: it picks the model's prompt (E5's).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from rag.api.deps import EmbedderDep, SettingsDep
from rag.api.routes.models import check_embedding_model
from rag.clients.backends import EmbeddingBackend
from rag.core.embeddings_api import (
    EmbeddingsResponse,
    EncodingFormat,
    InputType,
    check_embedding_inputs,
    embeddings_response,
)
from rag.core.errors import EmbedderUnavailable, InvalidRequest

router = APIRouter()


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # `user` and other OpenAI fields are accepted and ignored
    # fail_fast: a list of a million numbers stops at the first, instead of one validation error per item
    # (seconds of the event loop and a 60 MB error body for a 2 MB request).
    input: str | Annotated[list[str], Field(fail_fast=True)]
    model: str | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = Field(default=None, ge=1)
    # Ours, as the embedding server takes it (the openai SDK: `extra_body={"input_type": "passage"}`).
    input_type: InputType = "query"


async def check_dimensions(embedder: EmbeddingBackend, dimensions: int | None) -> None:
    """400 unless `dimensions` is absent or the model's own (asked of the embedding server's /health)."""
    if dimensions is None:
        return
    health = await embedder.health()
    if health["state"] != "ok":
        raise EmbedderUnavailable(f"embedding server is {health['state']}: {health.get('reason', '')}".rstrip(": "))
    if dimensions != health.get("dimensions"):
        raise InvalidRequest(
            f"dimensions={dimensions} is not supported: the model gives {health.get('dimensions')}-dimensional "
            "vectors (leave `dimensions` out, or send the model's own)",
            param="dimensions",
        )


@router.post("/embeddings")
async def create_embeddings(
    body: EmbeddingsRequest, settings: SettingsDep, embedder: EmbedderDep
) -> EmbeddingsResponse:
    model = check_embedding_model(settings, body.model)
    texts = [body.input] if isinstance(body.input, str) else body.input
    check_embedding_inputs(texts, max_inputs=settings.embed_max_inputs, max_chars=settings.max_message_chars)
    await check_dimensions(embedder, body.dimensions)
    vectors, usage = await embedder.embed_with_usage(texts, body.input_type)
    return embeddings_response(vectors, body.encoding_format, model, usage)
