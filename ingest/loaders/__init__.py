"""The parsers: bytes of a known type in, a `LoadedDocument` (extracted text plus sections) out.

`parse(kind, data, name)` is the unbounded core that the parser worker (`ingest.sandbox`) runs; call it
directly only on trusted input. The bounded entry point, which detects the type and picks the worker, is
`ingest.loading.load_document`. Nothing here imports the sandbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag.core.errors import DocumentRejected

from ..models import DocKind, LoadedDocument

if TYPE_CHECKING:
    from .ocr import OcrFn

DEFAULT_MAX_INFLATED = 256 << 20
DEFAULT_MAX_PAGES = 2_000
DEFAULT_MAX_OCR_PAGES = 200


def parse(
    kind: DocKind,
    data: bytes,
    name: str,
    *,
    text: str | None = None,
    encoding: str | None = None,
    max_inflated: int = DEFAULT_MAX_INFLATED,
    max_pages: int = DEFAULT_MAX_PAGES,
    ocr: OcrFn | None = None,
    max_ocr_pages: int = DEFAULT_MAX_OCR_PAGES,
    ocr_dpi: int = 200,
    min_confidence: float = 0.8,
    render_timeout_s: float = 30.0,
) -> LoadedDocument:
    """Parses `data` as `kind` in this process, without time or memory bounds (but those of `ocr`).

    Without `ocr`, images are refused and scanned PDF pages give no text. A man page is rendered by
    groff, in a child process of its own bounds (`render_timeout_s`)."""
    if kind is DocKind.PDF:
        from .pdf import load_pdf

        return load_pdf(data, name, max_pages, ocr, max_ocr_pages, ocr_dpi, min_confidence)
    if kind is DocKind.IMAGE:
        from .image import load_image

        return load_image(data, name, ocr, max_ocr_pages, min_confidence)
    if kind is DocKind.DOCX:
        from .docx import load_docx

        return load_docx(data, name, max_inflated)
    if kind is DocKind.HTML:
        from .html import load_html

        return load_html(data, name, text=text, encoding=encoding)
    if kind is DocKind.MAN:
        from .man import load_man

        return load_man(data, name, text=text, encoding=encoding, timeout_s=render_timeout_s)
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
