"""The FastAPI application: `uvicorn rag.api.app:create_app --factory`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from ingest.sandbox import stop_orphaned_workers
from rag.api.deps import get_access
from rag.api.errors import install_error_handlers
from rag.api.limits import ChatBodyLimit
from rag.api.mcp.http import PATH as MCP_PATH
from rag.api.mcp.http import McpEndpoint
from rag.api.metrics import Metrics, MetricsMiddleware, instrument
from rag.api.routes import (
    chat,
    documents,
    embeddings,
    health,
    metrics,
    models,
    openai_compat,
    pages,
    store,
    text_completions,
    web,
)
from rag.api.sameorigin import SameOriginGuard
from rag.api.services import Services, build_services
from rag.core.config import Settings, get_settings

RUN_RECORD = Path("run") / "api.json"  # in the data dir: the pid of the API that last started on it


def _stop_workers_of_the_last_run(data_dir: Path) -> None:
    """Stop the parser and OCR workers that the previous API of this data dir left when it was killed
    (one that could not see it die: they die with it otherwise), then record this API as the last."""
    record = data_dir / RUN_RECORD
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        stop_orphaned_workers(int(json.loads(record.read_text())["pid"]))
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"pid": os.getpid()}))


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    """Build the app; the services open at start-up (or are given, for tests)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _stop_workers_of_the_last_run(settings.data_dir)
        app.state.services = services or build_services(settings)
        instrument(app.state.services, app.state.metrics)
        app.state.services.start_worker()
        # The chunker is built while the API waits for its first upload (a task: start-up does not wait).
        warming = asyncio.ensure_future(app.state.services.pipeline().warm())
        try:
            await app.state.services.llm.check()  # a pool of differing servers is refused here
            await health.start_probing(app, app.state.services)
            async with mcp_endpoint.run():
                yield
        finally:
            warming.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # an upload reports a broken tokenizer
                await warming
            await app.state.services.aclose()

    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO)
    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN, which a local stack must not
    # need. The schema stays, as a /v1 route behind the key like the rest.
    app = FastAPI(title="rag", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(ChatBodyLimit, limit=settings.max_request_bytes)
    if settings.origins:  # the other sites allowed to write may also read the answers
        app.add_middleware(
            CORSMiddleware, allow_origins=sorted(settings.origins), allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(SameOriginGuard, settings=settings)
    # Added last, so outermost: the metrics count what the body limit refuses too.
    app.state.metrics = Metrics()
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    protected = [Depends(get_access)]
    app.include_router(health.router)
    app.include_router(documents.router, prefix="/v1", dependencies=protected)
    app.include_router(pages.router, prefix="/v1", dependencies=protected)
    app.include_router(chat.router, prefix="/v1", dependencies=protected)
    app.include_router(openai_compat.router, prefix="/v1", dependencies=protected)
    app.include_router(text_completions.router, prefix="/v1", dependencies=protected)
    app.include_router(models.router, prefix="/v1", dependencies=protected)
    app.include_router(embeddings.router, prefix="/v1", dependencies=protected)
    app.include_router(store.router, prefix="/v1", dependencies=protected)
    app.include_router(metrics.router, dependencies=protected)
    app.include_router(web.router)
    mcp_endpoint = McpEndpoint(settings, lambda: app.state.services)
    # An ASGI endpoint (the SDK's session manager answers the whole exchange), which Starlette's route takes.
    app.add_route(MCP_PATH, mcp_endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)  # type: ignore[arg-type]

    @app.get("/v1/openapi.json", include_in_schema=False, dependencies=protected)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    return app
