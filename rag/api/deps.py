"""Named dependencies of the routes: each resolves one part of the app's `Services` (built at start-up, or
given to `create_app` by a test).

They are `async def` although none awaits: FastAPI runs a plain `def` dependency in a worker thread,
and a chat request resolves four of them before its first token (a thread round trip each, several
milliseconds on a busy 2-core machine).
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request

from ingest.jobs import JobRegistry
from ingest.pipeline import IngestPipeline
from rag.answering.answerer import Answerer
from rag.api.services import Services
from rag.clients.embedding_pool import EmbeddingBackend
from rag.core.config import Settings
from rag.core.errors import Unauthorized
from rag.store.catalog import DocumentCatalog
from rag.store.lexical import LexicalIndex


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_app_settings(services: ServicesDep) -> Settings:
    return services.settings


async def get_embedder(services: ServicesDep) -> EmbeddingBackend:
    return services.embedder


async def get_catalog(services: ServicesDep) -> DocumentCatalog:
    return services.catalog


async def get_pipeline(services: ServicesDep) -> IngestPipeline:
    return services.pipeline()


async def get_jobs(services: ServicesDep) -> JobRegistry:
    return services.jobs


async def get_lexical(services: ServicesDep) -> LexicalIndex:
    return services.lexical


async def get_answerer(services: ServicesDep) -> Answerer:
    return services.answerer()


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
EmbedderDep = Annotated[EmbeddingBackend, Depends(get_embedder)]
CatalogDep = Annotated[DocumentCatalog, Depends(get_catalog)]
PipelineDep = Annotated[IngestPipeline, Depends(get_pipeline)]
JobsDep = Annotated[JobRegistry, Depends(get_jobs)]
AnswererDep = Annotated[Answerer, Depends(get_answerer)]
LexicalDep = Annotated[LexicalIndex, Depends(get_lexical)]


async def require_api_key(request: Request, settings: SettingsDep) -> None:
    """When RAG_API_KEY is set, every /v1 route (and /mcp) needs `Authorization: Bearer <key>`."""
    check_api_key(request.headers.get("authorization", ""), settings)


def check_api_key(header: str, settings: Settings) -> None:
    """Unauthorized unless `header` (an Authorization header) carries RAG_API_KEY, when one is set."""
    if settings.api_key is None:
        return
    scheme, _, token = header.partition(" ")
    expected = settings.api_key.get_secret_value()
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected.encode()):
        raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")
