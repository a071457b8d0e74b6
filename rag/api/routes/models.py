"""`GET /v1/models[/{id}]`: the served models in OpenAI's schema, which most clients list before a request.

The list names what this API serves: the generator (`RAG_LLM_MODEL`, the name llama-server serves with
`-a`), then one chat model per collection the key opens (`rag:NAME`: a chat with it searches that
collection, the way to choose one from a client that cannot send extra fields), then the embedding model
at the embedding server (`RAG_EMBED_MODEL`). `rag.role` says what each is for (`chat`, `embeddings`); a
chat naming the embedding model is a 400 that says so. Chat clients that list every model as a chat model
read two more fields of the embedding model's entry: its `name` says "embeddings only", and `info.meta`
(Open WebUI's model settings, passed through from a connection's list) hides it from the model picker. Ids are names, never file paths. `created` is when
this API started: the models have no creation time of their own here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from rag.api.deps import AccessDep, CatalogDep, ServicesDep
from rag.core.config import Settings
from rag.core.errors import ModelNotForChat, ModelNotFound

router = APIRouter()
COLLECTION_MODEL_PREFIX = "rag:"


def _omitted(value: object) -> bool:
    return value is None


class ServedBy(BaseModel):
    role: Literal["chat", "embeddings"]
    url: str
    collection: Annotated[str | None, Field(exclude_if=_omitted)] = None


class ClientMeta(BaseModel):
    """What Open WebUI reads of a listed model's `info.meta`: `hidden` keeps it out of the model picker."""

    hidden: bool
    description: str


class ClientInfo(BaseModel):
    meta: ClientMeta


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "rag-stack"
    name: Annotated[str | None, Field(exclude_if=_omitted)] = None  # a display name, where a client shows one
    info: Annotated[ClientInfo | None, Field(exclude_if=_omitted)] = None
    rag: ServedBy


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


def model_entries(settings: Settings, created: int, collections: Sequence[str] = ()) -> list[ModelEntry]:
    """The generator first, then a chat model per collection, then the embedding model."""
    chat = [ModelEntry(id=settings.llm_model, created=created, rag=ServedBy(role="chat", url=settings.llm_url))]
    chat += [
        ModelEntry(
            id=COLLECTION_MODEL_PREFIX + name,
            created=created,
            rag=ServedBy(role="chat", url=settings.llm_url, collection=name),
        )
        for name in collections
    ]
    not_for_chat = "The embedding model (POST /v1/embeddings), not a chat model."
    embed = ModelEntry(
        id=settings.embed_model,
        created=created,
        name=f"{settings.embed_model} (embeddings only)",
        info=ClientInfo(meta=ClientMeta(hidden=True, description=not_for_chat)),
        rag=ServedBy(role="embeddings", url=settings.embed_url),
    )
    return [*chat, embed]


def shown(name: str) -> str:
    """A client's model name as an error message quotes it: escaped (a lone surrogate cannot be encoded as
    UTF-8 in the response) and cut to 100 characters (a 1 MB name is not echoed back)."""
    return repr(name[:100] + ("..." if len(name) > 100 else ""))


@dataclass(frozen=True)
class ChatModel:
    """What a chat request's `model` chose: the name answered with, and a collection (`rag:NAME`)."""

    name: str
    collection: str | None = None


def check_chat_model(settings: Settings, name: str | None) -> ChatModel:
    """The generator (or a collection's `rag:NAME`) for a chat request; the embedding model is a 400 that
    says what it is for; any other name is a 404 as OpenAI answers it."""
    if name is None or name == settings.llm_model:
        return ChatModel(settings.llm_model)
    if name.startswith(COLLECTION_MODEL_PREFIX) and len(name) > len(COLLECTION_MODEL_PREFIX):
        return ChatModel(name, collection=name[len(COLLECTION_MODEL_PREFIX) :])
    if name == settings.embed_model:
        raise ModelNotForChat(
            f"The model {shown(name)} is the embedding model (POST /v1/embeddings), not a chat model; chat with "
            f"'{settings.llm_model}', or with 'rag:NAME' to search the collection NAME (GET /v1/models lists them)."
        )
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


async def _entries(services: ServicesDep, catalog: CatalogDep, access: AccessDep) -> list[ModelEntry]:
    counts = await asyncio.to_thread(catalog.counts)
    names = sorted(name for name, c in counts.items() if c.documents and access.allows(name))
    return model_entries(services.settings, services.started, names)


@router.get("/models")
async def list_models(services: ServicesDep, catalog: CatalogDep, access: AccessDep) -> ModelList:
    return ModelList(data=await _entries(services, catalog, access))


@router.get("/models/{model_id:path}")
async def get_model(model_id: str, services: ServicesDep, catalog: CatalogDep, access: AccessDep) -> ModelEntry:
    for entry in await _entries(services, catalog, access):
        if entry.id == model_id:
            return entry
    raise ModelNotFound(f"The model {shown(model_id)} does not exist.")
