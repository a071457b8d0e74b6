"""`GET /metrics`: the API's Prometheus metrics (see rag/api/metrics.py); the admin's (RAG_API_KEY) when a key is set."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rag.api.deps import AccessDep

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request, access: AccessDep) -> Response:
    access.require_admin("/metrics")
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
