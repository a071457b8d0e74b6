"""`GET /v1/models[/{id}]`: the served models in OpenAI's schema, which most clients list before a request.

The list names what this API serves: the generator (`RAG_LLM_MODEL`, the name llama-server serves with
`-a`) and the embedding model at the embedding server (`RAG_EMBED_MODEL`). Ids are names, never file
paths. `created` is when this API started: the models have no creation time of their own here.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel

from rag.api.deps import ServicesDep
from rag.core.config import Settings
from rag.core.errors import ModelNotFound

router = APIRouter()


class ServedBy(BaseModel):
    role: Literal["chat", "embeddings"]
    url: str


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "rag-stack"
    rag: ServedBy


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


def model_entries(settings: Settings, created: int) -> list[ModelEntry]:
    """The generator first, then the embedding model."""
    return [
        ModelEntry(id=settings.llm_model, created=created, rag=ServedBy(role="chat", url=settings.llm_url)),
        ModelEntry(id=settings.embed_model, created=created, rag=ServedBy(role="embeddings", url=settings.embed_url)),
    ]


def shown(name: str) -> str:
    """A client's model name as an error message quotes it: escaped (a lone surrogate cannot be encoded as
    UTF-8 in the response) and cut to 100 characters (a 1 MB name is not echoed back)."""
    return repr(name[:100] + ("..." if len(name) > 100 else ""))


def check_chat_model(settings: Settings, name: str | None) -> str:
    """The generator's name for a chat request; any other name is a 404 as OpenAI answers it."""
    if name is None or name == settings.llm_model:
        return settings.llm_model
    raise ModelNotFound(
        f"The model {shown(name)} does not exist; this API serves '{settings.llm_model}' for chat "
        "(GET /v1/models lists the models)."
    )


def check_embedding_model(settings: Settings, name: str | None) -> str:
    """The embedding model's name for an embeddings request; any other name is a 404 as OpenAI answers it."""
    if name is None or name == settings.embed_model:
        return settings.embed_model
    raise ModelNotFound(
        f"The model {shown(name)} does not exist; this API serves '{settings.embed_model}' for "
        "embeddings (GET /v1/models lists the models)."
    )


@router.get("/models")
async def list_models(services: ServicesDep) -> ModelList:
    return ModelList(data=model_entries(services.settings, services.started))


@router.get("/models/{model_id:path}")
async def get_model(model_id: str, services: ServicesDep) -> ModelEntry:
    for entry in model_entries(services.settings, services.started):
        if entry.id == model_id:
            return entry
    raise ModelNotFound(f"The model {shown(model_id)} does not exist.")
