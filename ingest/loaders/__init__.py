"""The parsers: bytes of a known type in, a `LoadedDocument` (extracted text plus sections) out.

`parse(kind, data, name)` is the unbounded core that the parser worker (`ingest.sandbox`) runs; call it
directly only on trusted input. The bounded entry point, which detects the type and picks the worker, is
`ingest.loading.load_document`. Nothing here imports the sandbox.
"""

from __future__ import annotations

from rag.core.errors import DocumentRejected

from ..models import DocKind, LoadedDocument

DEFAULT_MAX_INFLATED = 256 << 20
DEFAULT_MAX_PAGES = 2_000


def parse(
    kind: DocKind,
    data: bytes,
    name: str,
    *,
    text: str | None = None,
    encoding: str | None = None,
    max_inflated: int = DEFAULT_MAX_INFLATED,
    max_pages: int = DEFAULT_MAX_PAGES,
) -> LoadedDocument:
    """Parses `data` as `kind` in this process, without time or memory bounds."""
    if kind is DocKind.PDF:
        from .pdf import load_pdf

        return load_pdf(data, name, max_pages)
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


__all__ = ["DocKind", "LoadedDocument", "parse"]
