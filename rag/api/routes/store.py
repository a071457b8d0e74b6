"""`GET /v1/store/check`: `rag store check` on the store this API holds (the admin's), read through the
API's own Chroma client, since no second process may open an embedded Chroma that another writes."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from rag.api.deps import AccessDep, ServicesDep
from rag.store.repair import check_open_store

router = APIRouter()


@router.get("/store/check")
async def store_check(services: ServicesDep, access: AccessDep) -> dict[str, Any]:
    """Per collection, the catalog's, the record's, Chroma's and the BM25 index's counts; `consistent`."""
    access.require_admin("the store check")
    report = await asyncio.to_thread(check_open_store, services.settings.data_dir, services.store)
    return report.to_dict()
