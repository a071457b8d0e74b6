"""Where a PDF page's text sits, and its tables: line boxes from PDFium, tables from pdfplumber.

Boxes: PDFium's text rectangles (`FPDFText_CountRects`: one per run of characters on a line) are merged
into lines and located in the page's text in order, so each line gets a `TextBox` in fractions of the
page (top-left origin). A page that PDFium rotates gets no boxes (they would not match its image).

Tables: pdfplumber (pdfminer's layout, MIT) finds ruled tables (its default "lines" strategy: the cell
borders are drawn). pdfminer is slow next to PDFium, so only pages that draw at least `_MIN_PATHS` path
objects (lines or rectangles) are handed to it; a page without drawn lines has no ruled table. On a page
with tables the text is rebuilt from its lines outside the tables and the tables in between, in
top-to-bottom order; a short line just above a table is its caption. A table that goes on from the
previous page with no header of its own (same columns, first on its page) gets the previous header.
pdfminer gets `TABLE_BUDGET_S` seconds per document in all: past that the remaining pages are read as
text only, so a long PDF drawn with lines everywhere still loads within the parser's time limit.
"""

from __future__ import annotations

import io
import itertools
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from ..models import TextBox
from ._builder import DocumentBuilder, clean
from .tables import TableCarry, markdown_table

log = logging.getLogger(__name__)

_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_MIN_PATHS = 4
_CAPTION_GAP = 0.05  # of the page's height: a caption sits this close above its table
_CAPTION_CHARS = 160
TABLE_BUDGET_S = 20.0


@dataclass
class _Line:
    parts: list[str]
    x0: float
    top: float
    x1: float
    bottom: float

    @property
    def text(self) -> str:
        return " ".join(p.strip() for p in self.parts if p.strip())


@dataclass
class TableState:
    """The tables of one document: pdfplumber's reader, what carries from page to page (also for
    scanned pages), the time spent."""

    plumber: Any = None
    data: bytes = b""
    carry: TableCarry = field(default_factory=TableCarry)
    broken: bool = False
    spent_s: float = 0.0

    def page(self, index: int) -> Any:
        if self.plumber is None:
            import pdfplumber

            self.plumber = pdfplumber.open(io.BytesIO(self.data))
        return self.plumber.pages[index]

    def close(self) -> None:
        if self.plumber is not None:
            self.plumber.close()


def add_text_page(builder: DocumentBuilder, pdf: pdfium.PdfDocument, index: int, tables: TableState) -> int:
    """The text of page `index` into `builder`: its tables as tables, its lines with their boxes.
    Returns how many characters of text the page's text layer gave."""
    page = pdf[index]
    try:
        textpage = page.get_textpage()
        try:
            found = _tables(page, index, tables)
            if found:
                try:
                    return _add_with_tables(builder, textpage, page, found, tables)
                finally:
                    found[0].page.close()  # pdfplumber keeps each page's layout objects until closed
            text = _BLANK_LINES.sub("\n\n", clean(textpage.get_text_range())).strip()
            builder.block(text, boxes=_locate(text, _lines(textpage, page)))
            return len(text)
        finally:
            textpage.close()
    finally:
        page.close()


def _lines(textpage: pdfium.PdfTextPage, page: pdfium.PdfPage) -> list[_Line]:
    """PDFium's text rectangles merged into lines, in fractions of the page; [] for a rotated page."""
    if page.get_rotation() % 360:
        return []
    left, bottom, right, top = page.get_bbox()
    width, height = right - left, top - bottom
    if width <= 0 or height <= 0:
        return []
    lines: list[_Line] = []
    for i in range(textpage.count_rects()):
        x0, y0, x1, y1 = textpage.get_rect(i)
        text = clean(textpage.get_text_bounded(x0, y0, x1, y1))
        box = ((x0 - left) / width, (top - y1) / height, (x1 - left) / width, (top - y0) / height)
        last = lines[-1] if lines else None
        if last is not None and _overlap(last.top, last.bottom, box[1], box[3]):
            last.parts.append(text)
            last.x0, last.x1 = min(last.x0, box[0]), max(last.x1, box[2])
            last.top, last.bottom = min(last.top, box[1]), max(last.bottom, box[3])
        else:
            lines.append(_Line([text], *box))
    return [line for line in lines if line.text]


def _overlap(top_a: float, bottom_a: float, top_b: float, bottom_b: float) -> bool:
    shared = min(bottom_a, bottom_b) - max(top_a, top_b)
    return shared > 0.5 * min(bottom_a - top_a, bottom_b - top_b)


def _locate(text: str, lines: list[_Line]) -> list[TextBox]:
    """Boxes of the lines found in `text` in order (a line whose text is not found gets none)."""
    boxes, cursor = [], 0
    for line in lines:
        parts = [p.strip() for p in line.parts if p.strip()]
        start = text.find(parts[0], cursor)
        if start < 0:
            continue
        end = text.find(parts[-1], start)
        end = start + len(parts[0]) if end < 0 else end + len(parts[-1])
        boxes.append(TextBox(start, end, *_clamp(line.x0, line.top, line.x1, line.bottom)))
        cursor = end
    return boxes


def _clamp(*values: float) -> tuple[float, float, float, float]:
    x0, y0, x1, y1 = (min(max(v, 0.0), 1.0) for v in values)
    return x0, y0, x1, y1


def _tables(page: pdfium.PdfPage, index: int, state: TableState) -> list[Any]:
    """pdfplumber's tables of the page (top to bottom), for a page that draws enough lines for one."""
    paths = page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_PATH], max_depth=2)
    if state.broken or sum(1 for _ in itertools.islice(paths, _MIN_PATHS)) < _MIN_PATHS:
        return []
    if state.spent_s > TABLE_BUDGET_S:
        log.warning("table detection stopped at page %d: %.0f s spent on tables", index + 1, state.spent_s)
        state.broken = True
        return []
    started = time.monotonic()
    try:
        plumber_page = state.page(index)
        found = plumber_page.find_tables()
    except Exception as exc:  # pdfminer on a file PDFium reads: lose the tables, keep the text
        log.warning("table detection failed on page %d: %s", index + 1, exc)
        state.broken = True
        return []
    finally:
        state.spent_s += time.monotonic() - started
    tables = sorted((t for t in found if len(t.rows) >= 2), key=lambda t: t.bbox[1])
    if not tables:
        plumber_page.close()
    return tables


def _add_with_tables(
    builder: DocumentBuilder, textpage: pdfium.PdfTextPage, page: pdfium.PdfPage, found: list[Any], state: TableState
) -> int:
    """The page as its lines outside the tables and the tables, in top-to-bottom order; its characters."""
    height = float(found[0].page.height) or 1.0
    width = float(found[0].page.width) or 1.0
    regions = [(t.bbox[1] / height, t.bbox[3] / height, t) for t in found]

    def inside(ln: Any) -> bool:
        return any(top <= (ln.top + ln.bottom) / 2 <= bottom for top, bottom, _ in regions)

    lines = sorted((ln for ln in _lines(textpage, page) if not inside(ln)), key=lambda ln: ln.top)
    chars = 0
    for n, (top, _, table) in enumerate(regions):
        above = [ln for ln in lines if (ln.top + ln.bottom) / 2 < top]
        lines = lines[len(above) :]
        caption = ""
        if above and top - above[-1].bottom <= _CAPTION_GAP and len(above[-1].text) <= _CAPTION_CHARS:
            caption = above.pop().text
        chars += _flush_lines(builder, above)
        chars += _add_table(builder, table, caption, n == 0 and not above and not caption, state, width, height)
    return chars + _flush_lines(builder, lines)


def _flush_lines(builder: DocumentBuilder, lines: list[_Line]) -> int:
    if not lines:
        return 0
    text, boxes = "", []
    for line in lines:
        line_text = line.text
        if text:
            text += "\n"
        boxes.append(TextBox(len(text), len(text) + len(line_text), *_clamp(line.x0, line.top, line.x1, line.bottom)))
        text += line_text
    builder.block(text, boxes=boxes)
    return len(text)


def _add_table(
    builder: DocumentBuilder,
    table: Any,
    caption: str,
    first_on_page: bool,
    state: TableState,
    width: float,
    height: float,
) -> int:
    rows = [[clean(c or "") for c in row] for row in table.extract()]
    row_boxes = [r.bbox for r in table.rows]
    if not rows:
        return 0
    rows, caption, added = state.carry.follow(rows, caption, first_on_page)
    if added:
        row_boxes = [None, *row_boxes]
    md = markdown_table(rows, caption=caption or None)
    if md is None:
        return 0
    boxes = []
    for (start, end), source in zip(md.row_spans, md.rows):
        bbox = row_boxes[source]
        if bbox is not None:
            x0, top, x1, bottom = bbox
            boxes.append(TextBox(start, end, *_clamp(x0 / width, top / height, x1 / width, bottom / height)))
    builder.table(md.text, md.header, boxes=boxes)
    return len(md.text)
