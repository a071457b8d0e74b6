"""PDF: the text of each page, with page numbers and the outline (bookmarks) as heading paths.

A page's heading path is that of the last outline entry pointing at it or at an earlier page (an
outline points at pages, not at lines, so a chapter starting mid-page labels the whole page).

pypdfium2 wraps PDFium, Chrome's PDF engine: C++ that is fuzzed continuously by Chrome's security
team, and 10x or more faster at text extraction than the pure-Python pypdf. Neither is immune to
hostile files (PDFium aborts when a decompression bomb exhausts memory), so this module only ever
runs inside the bounded worker of `ingest.sandbox`.
"""

from __future__ import annotations

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from rag.core.errors import DocumentRejected

from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder, clean
from .pdf_layout import TableState, add_text_page

_MAX_OUTLINE_DEPTH = 8


def load_pdf(data: bytes, name: str, max_pages: int = 2_000) -> LoadedDocument:
    """One section per page with text; DocumentRejected for encrypted, broken or text-less PDFs."""
    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        # PDFium's error code is the last one it set: a file that fails without setting one (a page tree
        # of no pages) reports the previous file's code in a reused worker. Trust "password" only for a
        # file that has an /Encrypt dictionary at all.
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD and b"/Encrypt" in data:
            raise DocumentRejected(f"{name} is an encrypted PDF that needs a password; we cannot read it") from exc
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
            raise DocumentRejected(f"{name} is not a readable PDF (damaged, or without pages)") from exc
        raise DocumentRejected(f"{name} is not a readable PDF ({exc})") from exc
    tables = TableState(data=data)
    try:
        return _extract(pdf, name, max_pages, tables)
    finally:
        tables.close()
        pdf.close()


def _extract(pdf: pdfium.PdfDocument, name: str, max_pages: int, tables: TableState) -> LoadedDocument:
    n_pages = len(pdf)
    if n_pages == 0:
        raise DocumentRejected(f"{name} is a PDF without pages")
    if n_pages > max_pages:
        # Checked before any page is read: 6,000 pages sharing one content stream fit in 862 KB.
        raise DocumentRejected(
            f"{name} has {n_pages:,} pages; at most {max_pages:,} per document (RAG_MAX_DOCUMENT_PAGES)", limit=max_pages
        )
    outline = _outline_by_page(pdf)
    builder = DocumentBuilder()
    for index in range(n_pages):
        builder.page(index + 1)
        for level, title in outline.get(index, ()):
            builder.heading(title, level, raw="", sep="")
        add_text_page(builder, pdf, index, tables)
    title = pdf.get_metadata_value("Title").strip() or None
    try:
        return builder.build(name, DocKind.PDF, title=title, pages=n_pages)
    except DocumentRejected:
        raise DocumentRejected(
            f"{name} has no extractable text: its {n_pages} page(s) are images (a scan?) and we do not run OCR"
        ) from None


def _outline_by_page(pdf: pdfium.PdfDocument) -> dict[int, list[tuple[int, str]]]:
    """Outline entries (level, title) keyed by the page index they point at."""
    by_page: dict[int, list[tuple[int, str]]] = {}
    try:
        for item in pdf.get_toc(max_depth=_MAX_OUTLINE_DEPTH):
            title = clean(item.get_title()).strip()
            dest = item.get_dest()
            index = dest.get_index() if dest is not None else None
            if title and index is not None:
                by_page.setdefault(index, []).append((item.level + 1, title))
    except pdfium.PdfiumError:
        return {}  # a broken outline costs us headings, not the text
    return by_page
