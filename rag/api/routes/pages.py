"""A document's pages and a chunk in its place: `/v1/documents/{id}/pages/{n}`, `/v1/documents/{id}/chunks/{i}`.

A page is rendered from the kept original (`ingest.originals`) in the parser worker (`ingest.sandbox`:
PDFium and Pillow never run in the API process), at most `RAG_PAGE_IMAGE_MAX_WIDTH` pixels wide, and
cached beside the original; `?chunk=<index>` draws that chunk's boxes on it. A chunk's route returns it
with the text of its section around it, stitched from its neighbours in the record.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel

from ingest.models import decode_boxes
from ingest.originals import Originals
from ingest.sandbox import get_pool
from rag.api.deps import AccessDep, CatalogDep, LexicalDep, SettingsDep
from rag.core.config import Settings
from rag.core.errors import InvalidRequest, NotFound
from rag.store.catalog import DocumentRecord
from rag.store.document_text import characters

router = APIRouter()

CONTEXT_CHARS = 1500  # of the section's text shown on each side of a chunk
NEIGHBOURS = 6  # chunks looked at on each side for that text
WIDTH_STEP = 100  # widths are rounded down to this, so the cache holds few sizes of a page

DocId = Annotated[str, Path(pattern="^[0-9a-f]{8,128}$", description="The document's id (the sha256 of its bytes).")]
CollectionQuery = Annotated[str | None, Query(description="Default: RAG_COLLECTION.")]


class ChunkInContext(BaseModel):
    """A chunk, the text of its section before and after it, its page and its boxes on that page."""

    chunk_id: str
    doc_id: str
    index: int
    source: str
    page: int | None
    heading: str | None
    text: str
    before: str
    after: str
    boxes: list[list[float]]
    page_image: bool


async def get_originals(settings: SettingsDep) -> Originals:
    return Originals(settings.data_dir)


OriginalsDep = Annotated[Originals, Depends(get_originals)]


@router.get(
    "/documents/{doc_id}/pages/{page}",
    response_class=Response,
    responses={200: {"description": "The page as a PNG.", "content": {"image/png": {}}}},
)
async def page_image(
    doc_id: DocId,
    page: Annotated[int, Path(ge=1)],
    settings: SettingsDep,
    catalog: CatalogDep,
    lexical: LexicalDep,
    originals: OriginalsDep,
    access: AccessDep,
    collection: CollectionQuery = None,
    chunk: Annotated[int | None, Query(ge=0, description="Highlight this chunk (its index) on the page.")] = None,
    width: Annotated[int | None, Query(ge=200, description="Pixels; at most RAG_PAGE_IMAGE_MAX_WIDTH.")] = None,
) -> Response:
    """Page `page` of a PDF (or image) document as a PNG, optionally with a chunk's passage highlighted."""
    name = access.collection(collection, settings)
    record = await _document(catalog, name, doc_id)
    if not record.pages or page > record.pages:
        has = f"has {record.pages} page{'s' if record.pages != 1 else ''}" if record.pages else "has no pages"
        raise NotFound(f"no page {page}: {record.name} {has}")
    original = await asyncio.to_thread(originals.path, name, doc_id)
    if original is None:
        raise NotFound(
            f"{record.name} has no stored original to show (indexed before originals were kept: upload it again)"
        )
    max_width = settings.page_image_max_width
    if width is not None and width > max_width:
        raise InvalidRequest(f"width {width} is over {max_width} pixels (RAG_PAGE_IMAGE_MAX_WIDTH)", limit=max_width)
    width = max(200, (width or min(1000, max_width)) // WIDTH_STEP * WIDTH_STEP)
    boxes: list[list[float]] = []
    cache_name = f"p{page}-w{width}"
    if chunk is not None:
        meta = (await _chunk(lexical, name, doc_id, chunk))[1]
        if meta.get("page") != page:
            raise InvalidRequest(f"chunk {chunk} of {record.name} is on page {meta.get('page')}, not {page}")
        boxes, cache_name = decode_boxes(meta.get("boxes")), f"{cache_name}-c{chunk}"
    png = await asyncio.to_thread(
        _rendered, settings, originals, name, doc_id, record.name, page, width, boxes, cache_name
    )
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=86400"})


@router.get("/documents/{doc_id}/chunks/{index}")
async def chunk_in_context(
    doc_id: DocId,
    index: Annotated[int, Path(ge=0)],
    settings: SettingsDep,
    catalog: CatalogDep,
    lexical: LexicalDep,
    originals: OriginalsDep,
    access: AccessDep,
    collection: CollectionQuery = None,
) -> ChunkInContext:
    """A chunk with the text of its section before and after it, its page and its boxes on that page."""
    name = access.collection(collection, settings)
    record = await _document(catalog, name, doc_id)
    text, meta = await _chunk(lexical, name, doc_id, index)
    ids = [f"{doc_id}:{i}" for i in range(max(0, index - NEIGHBOURS), index + NEIGHBOURS + 1)]
    around = await asyncio.to_thread(lexical.chunks, name, ids)
    same = [
        (t, m)
        for t, m in around.values()
        if m.get("page") == meta.get("page") and m.get("heading") == meta.get("heading")
    ]
    before, after = _context(same, meta)
    page = meta.get("page")
    has_image = page is not None and await asyncio.to_thread(originals.path, name, doc_id) is not None
    return ChunkInContext(
        chunk_id=f"{doc_id}:{index}",
        doc_id=doc_id,
        index=index,
        source=meta.get("source", record.name),
        page=page,
        heading=meta.get("heading"),
        text=text,
        before=before,
        after=after,
        boxes=decode_boxes(meta.get("boxes")),
        page_image=has_image,
    )


async def _document(catalog: Any, collection: str, doc_id: str) -> DocumentRecord:
    record = await asyncio.to_thread(catalog.get, collection, doc_id)
    if record is None or record.state != "indexed":
        raise NotFound(f"no document {doc_id} in collection {collection}")
    return cast(DocumentRecord, record)


async def _chunk(lexical: Any, collection: str, doc_id: str, index: int) -> tuple[str, dict[str, Any]]:
    found = await asyncio.to_thread(lexical.chunks, collection, [f"{doc_id}:{index}"])
    if not found:
        raise NotFound(f"document {doc_id} has no chunk {index}")
    return cast(tuple[str, dict[str, Any]], next(iter(found.values())))


def _context(chunks: list[tuple[str, dict[str, Any]]], target: dict[str, Any]) -> tuple[str, str]:
    """The section's text before and after the target, rebuilt from chunks that overlap or touch.

    The chunks give the document's characters (`rag.store.document_text`); a gap (whitespace the chunker
    stripped between two chunks) is one space.
    """
    spans = characters(chunks)
    t_start, t_end = target.get("start"), target.get("end")
    if not isinstance(t_start, int) or not isinstance(t_end, int):
        return "", ""
    before = _run(spans, t_start - 1, -1)[::-1]
    after = _run(spans, t_end, 1)
    return before[-CONTEXT_CHARS:], after[:CONTEXT_CHARS]


def _run(chars: dict[int, str], at: int, step: int) -> str:
    """Characters from `at` in direction `step`, across gaps of up to 4 characters, for CONTEXT_CHARS + 1."""
    out: list[str] = []
    gap = 0
    while len(out) <= CONTEXT_CHARS and gap <= 4:
        if at in chars:
            if gap:
                out.append(" ")
            out.append(chars[at])
            gap = 0
        else:
            gap += 1
        at += step
    return "".join(out).strip()


def _rendered(
    settings: Settings,
    originals: Originals,
    collection: str,
    doc_id: str,
    name: str,
    page: int,
    width: int,
    boxes: list[list[float]],
    cache_name: str,
) -> bytes:
    """The cached PNG, or one rendered in the parser worker now (and cached)."""
    cached = originals.page_path(collection, doc_id, cache_name)
    if cached.is_file():
        return cached.read_bytes()
    source = originals.path(collection, doc_id)
    if source is None:
        raise NotFound(f"{name} has no stored original to show")
    pool = get_pool(settings.parse_memory_mb)
    png = pool.render(
        source.read_bytes(), name, timeout_s=settings.parse_timeout_s, page=page, width=width, boxes=boxes
    )
    originals.save_page(cached, png)
    return png
