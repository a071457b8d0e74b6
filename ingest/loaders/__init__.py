"""Loading: bytes in, a `LoadedDocument` (extracted text plus sections) out.

The entry point for the pipeline, the upload endpoint and the CLI:

    doc = load_document(data, name, settings)

It detects the type from the bytes (`ingest.detect`), then parses. Plain text, Markdown and small HTML
are parsed in this process (linear-time work on already-decoded text). PDF, DOCX and large HTML are
parsed in a bounded worker process (`ingest.sandbox`): `settings.parse_timeout_s` of wall-clock time
and `settings.parse_memory_mb` of address space, so a hostile file costs a worker, never the service.

Errors, all from `rag.errors`: `UnsupportedFileType` (415) names the type the bytes showed;
`DocumentRejected` (422) says why a readable file has nothing to index (empty, whitespace only,
encrypted, scanned, a bomb, over the time or memory limit).

`parse(kind, data, name)` is the unbounded core that the worker runs; call it directly only on
trusted input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag.errors import DocumentRejected

from ..detect import classify
from ..models import DocKind, LoadedDocument

if TYPE_CHECKING:
    from rag.config import Settings

    from ..sandbox import ParserPool

# HTML up to this size is parsed in-process: Lexbor is linear and this stays in the milliseconds.
INPROCESS_HTML_BYTES = 256 * 1024
DEFAULT_MAX_INFLATED = 256 << 20


def load_document(data: bytes, name: str, settings: Settings, pool: ParserPool | None = None) -> LoadedDocument:
    """The document in `data` (named `name` for messages and metadata only), parsed within bounds."""
    detection = classify(data, name)
    kind = detection.kind
    if kind in (DocKind.PDF, DocKind.DOCX) or (kind is DocKind.HTML and len(data) > INPROCESS_HTML_BYTES):
        from ..sandbox import get_pool

        pool = pool or get_pool(settings.parse_memory_mb)
        return pool.parse(kind, data, name, timeout_s=settings.parse_timeout_s, max_inflated=inflate_limit(settings))
    return parse(kind, data, name, text=detection.text, encoding=detection.encoding)


def inflate_limit(settings: Settings) -> int:
    """How many bytes a DOCX may inflate to: a quarter of the parser's memory (python-docx and lxml
    need several times the XML's size)."""
    return (settings.parse_memory_mb << 20) // 4


def parse(
    kind: DocKind,
    data: bytes,
    name: str,
    *,
    text: str | None = None,
    encoding: str | None = None,
    max_inflated: int = DEFAULT_MAX_INFLATED,
) -> LoadedDocument:
    """Parses `data` as `kind` in this process, without time or memory bounds."""
    if kind is DocKind.PDF:
        from .pdf import load_pdf

        return load_pdf(data, name)
    if kind is DocKind.DOCX:
        from .docx import load_docx

        return load_docx(data, name, max_inflated)
    if kind is DocKind.HTML:
        from .html import load_html

        return load_html(data, name, text=text, encoding=encoding)
    if text is None:
        from ..detect import decode_text

        text, encoding = decode_text(data)
    from .text import load_markdown, load_text

    if kind is DocKind.MARKDOWN:
        return load_markdown(text, name, encoding)
    if kind is DocKind.TEXT:
        return load_text(text, name, encoding)
    raise DocumentRejected(f"{name}: no loader for {kind}")


__all__ = ["DocKind", "LoadedDocument", "load_document", "inflate_limit", "parse"]
