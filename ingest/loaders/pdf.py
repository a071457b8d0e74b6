"""PDF: the text of each page, with page numbers and the outline (bookmarks) as heading paths.

A page's heading path is that of the last outline entry pointing at it or at an earlier page (an
outline points at pages, not at lines, so a chapter starting mid-page labels the whole page).

pypdfium2 wraps PDFium, Chrome's PDF engine: C++ that is fuzzed continuously by Chrome's security
team, and 10x or more faster at text extraction than the pure-Python pypdf. Neither is immune to
hostile files (PDFium aborts when a decompression bomb exhausts memory), so this module only ever
runs inside the bounded worker of `ingest.sandbox`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from rag.core.errors import DocumentRejected

from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder, clean
from .furniture import without_furniture
from .ocr import MAX_SIDE, OcrFn, add_read_page, announce_pages, read_page
from .pdf_layout import TableState, add_text_page

_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_MAX_OUTLINE_DEPTH = 8
# A page is read by OCR when its text layer holds fewer characters than this per square inch of page
# (31 on an A4 page: a running head and a page number, never a body: an A4 page holding one short SQuAD
# or CMRC paragraph has 3.9 or more, a full page ~30; bench/scanned.py) and images cover at least
# _SCAN_IMAGE_SHARE of it.
_MIN_CHARS_PER_SQUARE_INCH = 1 / 3
_SCAN_IMAGE_SHARE = 0.3


def load_pdf(
    data: bytes,
    name: str,
    max_pages: int = 2_000,
    ocr: OcrFn | None = None,
    max_ocr_pages: int = 200,
    ocr_dpi: int = 200,
    min_confidence: float = 0.8,
) -> LoadedDocument:
    """One section per page with text; DocumentRejected for encrypted, broken or text-less PDFs.

    With `ocr`, scanned pages (images, next to no text layer) are rendered at `ocr_dpi` and read by it;
    the other pages keep their text layer."""
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
        return _extract(pdf, name, max_pages, _OcrPlan(ocr, max_ocr_pages, ocr_dpi, min_confidence), tables)
    finally:
        tables.close()
        pdf.close()


@dataclass(frozen=True, slots=True)
class _OcrPlan:
    ocr: OcrFn | None
    max_pages: int
    dpi: int
    min_confidence: float


def _extract(pdf: pdfium.PdfDocument, name: str, max_pages: int, plan: _OcrPlan, tables: TableState) -> LoadedDocument:
    n_pages = len(pdf)
    if n_pages == 0:
        raise DocumentRejected(f"{name} is a PDF without pages")
    if n_pages > max_pages:
        # Checked before any page is read: 6,000 pages sharing one content stream fit in 862 KB.
        raise DocumentRejected(
            f"{name} has {n_pages:,} pages; at most {max_pages:,} per document (RAG_MAX_DOCUMENT_PAGES)",
            limit=max_pages,
        )
    outline = _outline_by_page(pdf)
    texts = [_page_text(pdf, index) for index in range(n_pages)]
    scanned = _scanned_pages(pdf, texts) if plan.ocr is not None else set()
    if len(scanned) > plan.max_pages:
        raise DocumentRejected(
            f"{name} has {len(scanned):,} scanned pages (of {n_pages:,}) to read by OCR; at most {plan.max_pages:,} "
            "per document (RAG_MAX_OCR_PAGES)",
            limit=plan.max_pages,
        )
    # Every scanned page is read before any is laid out: a running header is known by its repeats.
    if plan.ocr:
        announce_pages(plan.ocr, len(scanned))
    read = without_furniture({i: read_page(_render(pdf, i, plan.dpi), plan.ocr) for i in sorted(scanned) if plan.ocr})
    builder = DocumentBuilder()
    notes: list[str] = []
    for index in range(n_pages):
        builder.page(index + 1)
        tables.carry.turn_page()
        for level, title in outline.get(index, ()):
            builder.heading(title, level, raw="", sep="")
        if index in read:
            notes += add_read_page(builder, index + 1, read[index], plan.min_confidence, tables.carry)
        else:  # the text layer, with its tables as tables and its lines' boxes
            add_text_page(builder, pdf, index, tables)
    doc_title = pdf.get_metadata_value("Title").strip() or None
    try:
        return builder.build(name, DocKind.PDF, title=doc_title, pages=n_pages, warnings=tuple(notes))
    except DocumentRejected:
        how = "nor text that OCR could read" if scanned else "and no scanned pages to read by OCR"
        raise DocumentRejected(
            f"{name} has no extractable text: no text layer on its {n_pages} page(s), {how}"
        ) from None


def _scanned_pages(pdf: pdfium.PdfDocument, texts: list[str]) -> set[int]:
    """The pages to read by OCR: next to no text for their area, and mostly covered by images."""
    scanned = set()
    for index, text in enumerate(texts):
        page = pdf[index]
        try:
            width, height = page.get_size()
            area = max(width * height, 1.0)
            if len(text.replace(" ", "").replace("\n", "")) >= _MIN_CHARS_PER_SQUARE_INCH * area / 72**2:
                continue
            covered = 0.0
            for obj in page.get_objects(filter=(pdfium_c.FPDF_PAGEOBJ_IMAGE,), max_depth=4):
                left, bottom, right, top = obj.get_bounds()
                covered += max(0.0, min(right, width) - max(left, 0.0)) * max(0.0, min(top, height) - max(bottom, 0.0))
                if covered >= _SCAN_IMAGE_SHARE * area:
                    scanned.add(index)
                    break
        finally:
            page.close()
    return scanned


def _render(pdf: pdfium.PdfDocument, index: int, dpi: int) -> object:
    """Page `index` as a grayscale numpy array at `dpi`, at most MAX_SIDE pixels on its long side."""
    page = pdf[index]
    try:
        scale = min(dpi / 72, MAX_SIDE / max(*page.get_size(), 1.0))
        bitmap = page.render(scale=scale, grayscale=True)
        try:
            array = bitmap.to_numpy()
            return (array[:, :, 0] if array.ndim == 3 else array).copy()
        finally:
            bitmap.close()
    finally:
        page.close()


def _page_text(pdf: pdfium.PdfDocument, index: int) -> str:
    page = pdf[index]
    try:
        textpage = page.get_textpage()
        try:
            text = textpage.get_text_range()
        finally:
            textpage.close()
    finally:
        page.close()
    return _BLANK_LINES.sub("\n\n", clean(text)).strip()


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
