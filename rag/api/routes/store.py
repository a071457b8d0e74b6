"""`GET /v1/store/check`: `rag store check` on the store this API holds (the admin's), read through the
API's own Chroma client, since no second process may open an embedded Chroma that another writes."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from pydantic import BaseModel

from rag.api.deps import AccessDep, ServicesDep
from rag.store.repair import check_open_store, vectors_name

router = APIRouter()


class CollectionCounts(BaseModel):
    """One collection's counts in each part of the store, and what disagrees (`problems`)."""

    collection: str
    documents: int
    failed: int
    catalog_chunks: int
    record_chunks: int
    record_vectors: int
    chroma: int | None
    chroma_state: str
    orphan_vectors: int | None
    missing_vectors: int | None
    problems: list[str]


class LexicalCounts(BaseModel):
    record: int
    index: int


class StoreReport(BaseModel):
    """`consistent` when every part agrees; else `fix` names the command that repairs the store."""

    consistent: bool
    vector_store: str  # where the vectors are: Chroma or pgvector
    chroma_unreadable: str | None
    lexical: LexicalCounts
    collections: list[CollectionCounts]
    fix: str | None


@router.get("/store/check")
async def store_check(services: ServicesDep, access: AccessDep) -> StoreReport:
    """Per collection, the catalog's, the record's, Chroma's and the BM25 index's counts; `consistent`."""
    access.require_admin("the store check")
    report = await asyncio.to_thread(
        check_open_store, services.store, services.catalog, services.lexical, vectors_name(services.settings)
    )
    return StoreReport.model_validate(report.to_dict())
