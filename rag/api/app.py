"""The FastAPI application: `uvicorn rag.api.app:create_app --factory`."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from rag.api.deps import require_api_key
from rag.api.errors import install_error_handlers
from rag.api.metrics import Metrics, MetricsMiddleware, instrument
from rag.api.routes import chat, documents, health, metrics, models, openai_compat, web
from rag.api.services import Services, build_services
from rag.core.config import Settings, get_settings


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    """Build the app; the services open at start-up (or are given, for tests)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.services = services or build_services(settings)
        instrument(app.state.services, app.state.metrics)
        try:
            yield
        finally:
            await app.state.services.aclose()

    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO)
    app = FastAPI(title="rag", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.state.metrics = Metrics()
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    protected = [Depends(require_api_key)]
    app.include_router(health.router)
    app.include_router(documents.router, prefix="/v1", dependencies=protected)
    app.include_router(chat.router, prefix="/v1", dependencies=protected)
    app.include_router(openai_compat.router, prefix="/v1", dependencies=protected)
    app.include_router(models.router, prefix="/v1", dependencies=protected)
    app.include_router(metrics.router, dependencies=protected)
    app.include_router(web.router)
    return app
