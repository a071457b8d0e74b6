"""Loading: bytes in, a `LoadedDocument` (extracted text plus sections) out, within bounds.

The entry point for the pipeline, the upload endpoint and the CLI:

    doc = load_document(data, name, settings)

It detects the type from the bytes (`ingest.detect`), then parses. Plain text and Markdown are parsed in
this process (linear-time work on already-decoded text). PDF, DOCX, images, HTML (whose parser runs
third-party code and the page's stylesheet rules) and man pages (rendered by groff) are parsed in a bounded worker process
(`ingest.sandbox`): `settings.parse_timeout_s` of wall-clock time
and `settings.parse_memory_mb` of address space, so a hostile file costs a worker, never the service.
Images and scanned PDF pages are read by OCR in workers of their own (`ingest.ocr_pool`), a page at a
time under `settings.ocr_page_timeout_s` and `settings.ocr_memory_mb`.

Errors, all from `rag.core.errors`: `UnsupportedFileType` (415) names the type the bytes showed;
`DocumentRejected` (422) says why a readable file has nothing to index (empty, nothing visible in it,
encrypted, scanned, a bomb, over the time or memory limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rag.core.errors import UnsupportedFileType

from .compressed import gunzip, inner_name, is_gzip
from .detect import classify
from .loaders import parse
from .models import DocKind, LoadedDocument
from .ocr_pool import get_ocr_pool
from .sandbox import ParserPool, get_pool, page_listener

if TYPE_CHECKING:
    from rag.core.config import Settings

# Parsed in the bounded worker (PDF and images too, with the OCR reader): the API process never runs a
# parser over them, so one page cannot stall every request while it holds the GIL.
SANDBOXED_KINDS = frozenset({DocKind.DOCX, DocKind.HTML, DocKind.MAN})


def load_document(data: bytes, name: str, settings: Settings, pool: ParserPool | None = None) -> LoadedDocument:
    """The document in `data` (named `name` for messages and metadata only), parsed within bounds; a
    gzip file is decompressed within bounds first and loaded by what it holds (`ingest.compressed`)."""
    if not is_gzip(data):
        return _load(data, name, name, settings, pool)
    inner = gunzip(data, name, settings.max_upload_bytes)
    try:
        return _load(inner, name, inner_name(name), settings, pool)
    except UnsupportedFileType as exc:
        raise UnsupportedFileType(f"{exc.message} inside the gzip file", **exc.detail) from None


def _load(data: bytes, name: str, type_name: str, settings: Settings, pool: ParserPool | None) -> LoadedDocument:
    """`data` parsed by its type (`type_name`'s extension breaks ties among text kinds)."""
    detection = classify(data, type_name)
    kind = detection.kind
    options = _worker_options(kind, name, settings)
    if options is None:
        return parse(kind, data, name, text=detection.text, encoding=detection.encoding)
    pool = pool or get_pool(settings.parse_memory_mb)
    return pool.parse(
        kind, data, name, timeout_s=settings.parse_timeout_s, max_pages=settings.max_document_pages, **options
    )


def _worker_options(kind: DocKind, name: str, settings: Settings) -> dict[str, Any] | None:
    """What the parser worker takes for a file of `kind` besides its bounds; None for a kind parsed here."""
    if kind in (DocKind.PDF, DocKind.IMAGE):
        return {"ocr": get_ocr_pool(settings).reader(name), "on_page": page_listener.get(), **ocr_options(settings)}
    if kind in SANDBOXED_KINDS:
        # groff, which the worker starts for a man page, must stop before the worker's own deadline.
        return {"max_inflated": inflate_limit(settings), "render_timeout_s": settings.parse_timeout_s / 2}
    return None


def ocr_options(settings: Settings) -> dict[str, int | float]:
    """The OCR settings the loaders take (the page cap, the rendering DPI, the confidence floor)."""
    return {
        "max_ocr_pages": settings.max_ocr_pages,
        "ocr_dpi": settings.ocr_dpi,
        "min_confidence": settings.ocr_min_confidence,
    }


def inflate_limit(settings: Settings) -> int:
    """How many bytes a DOCX may inflate to: a quarter of the parser's memory (python-docx and lxml
    need several times the XML's size)."""
    return (settings.parse_memory_mb << 20) // 4
