"""Named dependencies of the routes: each resolves one part of the app's `Services` (built at start-up, or
given to `create_app` by a test).

They are `async def` although none awaits: FastAPI runs a plain `def` dependency in a worker thread,
and a chat request resolves four of them before its first token (a thread round trip each, several
milliseconds on a busy 2-core machine).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import Depends, Request

from ingest.job_queue import JobQueue
from ingest.jobs import JobRegistry
from ingest.pipeline import IngestPipeline
from rag.answering.answerer import Answerer
from rag.api.access import Access, authorize
from rag.api.services import Services
from rag.clients.backends import EmbeddingBackend
from rag.core.config import Settings
from rag.store.catalog import DocumentCatalog
from rag.store.chunk_record import LexicalIndex


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


async def get_job_queue(services: ServicesDep) -> JobQueue | None:
    return services.queue


async def get_lexical(services: ServicesDep) -> LexicalIndex:
    return services.lexical


async def get_answerer(services: ServicesDep) -> Answerer:
    return services.answerer()


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
EmbedderDep = Annotated[EmbeddingBackend, Depends(get_embedder)]
CatalogDep = Annotated[DocumentCatalog, Depends(get_catalog)]
PipelineDep = Annotated[IngestPipeline, Depends(get_pipeline)]
JobsDep = Annotated[JobRegistry, Depends(get_jobs)]
JobQueueDep = Annotated[JobQueue | None, Depends(get_job_queue)]  # None: uploads run in this process
AnswererDep = Annotated[Answerer, Depends(get_answerer)]
LexicalDep = Annotated[LexicalIndex, Depends(get_lexical)]


async def get_access(request: Request, services: ServicesDep) -> Access:
    """Who the request is (rag/api/access.py): when RAG_API_KEY is set, every /v1 route (and /mcp) needs
    `Authorization: Bearer <key>`, the admin's or a scoped one."""
    access = await request_access(request.headers.get("authorization", ""), services)
    request.state.access = access  # the error handler words a 404 for this key (Access.hidden)
    return access


async def request_access(header: str, services: Services) -> Access:
    """The Access of an Authorization header; a scoped key's `last used` is written at most once a
    minute, in a thread (a read of its row is microseconds, a write may wait for the file's lock)."""
    access = authorize(header, services.settings, services.key_store())
    key, now = access.key, time.time()
    if key is not None and services.key_store().due_for_touch(key, now):
        await asyncio.to_thread(services.key_store().touch, key.id, now)
    return access


AccessDep = Annotated[Access, Depends(get_access)]
