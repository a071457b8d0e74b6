"""OCR of one page image: RapidOCR's lines, put in reading order, as page text with a box per line.

    lines = recognize(make_engine(), image)          # in the OCR worker (ingest.ocr_pool)
    add_ocr_page(builder, n, image, ocr, 0.8, carry) # in a loader: page n's text and tables, through `ocr`
                                                     # (an image in; PageLines(lines) or PageLeftOut(why) out)
    blocks = layout(lines)                           # the lines in reading order: TextBlock, TableBlock

The engine is RapidOCR 3.10 (PP-OCRv6 detection and recognition, Chinese and English in one model;
its 180° line classifier is off, see `make_engine`), run by onnxruntime on one thread; its model files come inside the
`rapidocr` wheel and are pinned in models.lock. The spaces inside a line that the recogniser ran
together ("andstored") are put back from the white gaps of the line's image (`word_spaces`). A loader
does not call the engine itself: it gets an `OcrFn` (an image in, a `PageRead` out), which the parser
worker forwards to the OCR worker, so the OCR of a page has its own time and memory bounds.

Reading order, done here because RapidOCR only sorts lines top to bottom: lines that span most of the
text's width (titles, a one-column body) cut the page into bands; inside a band, lines whose x ranges
leave a gutter free form columns, read one after the other when each is a real column (wide and at
least three lines tall; narrower ones are table cells and are read row by row). Segments at the same
height join into one row; a vertical gap of more than a line's height starts a paragraph. The lines of
a paragraph are joined as running text (a space; nothing next to a Chinese character, nor where the break
falls inside a word of Chinese text, which wraps anywhere, inside a number too), since a line break inside a
sentence would split the phrases that search and answers quote.

Tables: two or more rows of several cells whose boxes line up in two columns or more (`tables.grid`)
are a table, written as markdown under its caption (a short line just above it) with its top row as the
header, as a born-digital table is, so every chunk of its rows repeats the header; a table first on its
page without a caption continues the previous page's (`tables.TableCarry`).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rag.core.cjk import has_cjk, is_cjk

from ..models import LoadedDocument, TextBox
from ._builder import DocumentBuilder, clean
from .tables import TableCarry, grid, markdown_table
from .word_spaces import spaced

MAX_SIDE = 2000  # pixels on an image's long side that the detector reads (RapidOCR's default): larger is downscaled
# A page narrower or lower than this holds no line OCR could read: it is not sent (each call costs about
# 1.5 s whatever the size, so 180 pages of 1 x 1 pixel cost 327 s); nor is a page of one grey.
MIN_TEXT_SIDE = 8
_SPANNING = 0.55  # a line this share of the text's width or wider spans every column
_MIN_COLUMN = 0.2  # a column is at least this share of the text's width...
_MIN_COLUMN_LINES = 3  # ...and this many lines tall
_CAPTION_CHARS = 160  # a caption is a short line of its own...
_CAPTION_GAP = 1.0  # ...at most a line's height above its table


@dataclass(frozen=True, slots=True)
class OcrLine:
    """One line the OCR read: its text, its box in fractions of the page (origin top left), its score."""

    text: str
    x0: float
    y0: float
    x1: float
    y1: float
    confidence: float

    @property
    def height(self) -> float:
        return self.y1 - self.y0

    @property
    def middle(self) -> float:
        return (self.y0 + self.y1) / 2


@dataclass(frozen=True, slots=True)
class PageLines:
    """The lines OCR read on a page."""

    lines: list[OcrLine]


@dataclass(frozen=True, slots=True)
class PageLeftOut:
    """The page was not read (over its time or memory, or its OCR worker failed): why, for the warning."""

    why: str


PageRead = PageLines | PageLeftOut  # what OCR made of one page, from the OCR worker up to the layout
OcrFn = Callable[[Any], PageRead]  # a 2-D uint8 image (grayscale) in, its lines or why it was left out


def make_engine(threads: int = 1, params: Mapping[str, Any] | None = None) -> Any:
    """A RapidOCR engine on the models inside the wheel, `threads` onnxruntime threads, quiet (`params`:
    other RapidOCR settings over these, as bench/ocr_speed.py tries them)."""
    from rapidocr import RapidOCR

    return RapidOCR(
        params={
            "Global.log_level": "error",  # "the text detection result is empty" is no news
            "Global.max_side_len": MAX_SIDE,
            # The 180-degree line classifier turned upright lines of our scans over (3 of 11 lines of a
            # SQuAD page read as garbage, scores ~0.6); without it all 11 read right. Pages come upright
            # (EXIF for photos); an upside-down scan is read badly and flagged by its low scores.
            "Global.use_cls": False,
            # One line a batch: a batch pads every line to the widest of them (RapidOCR's default is 6),
            # and on rough two-column pages one line at a time cost 15% less CPU for the same text
            # (bench/ocr_speed.py, bench/README.md).
            "Rec.rec_batch_num": 1,
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
        | dict(params or {})
    )


def recognize(engine: Any, image: Any) -> list[OcrLine]:
    """The lines `engine` reads in `image` (a numpy array), boxes as fractions of the image."""
    height, width = image.shape[:2]
    result = engine(image, return_word_box=True, return_single_char_box=True)
    if result.boxes is None or result.txts is None or result.scores is None:
        return []
    chars = result.word_results if len(result.word_results or ()) == len(result.txts) else [()] * len(result.txts)
    lines = []
    for box, text, score, line_chars in zip(result.boxes, result.txts, result.scores, chars, strict=True):
        text = clean(spaced(str(text), image, box, line_chars)).strip()
        if not text:
            continue
        xs, ys = [float(p[0]) for p in box], [float(p[1]) for p in box]
        lines.append(
            OcrLine(
                text,
                _fraction(min(xs), width),
                _fraction(min(ys), height),
                _fraction(max(xs), width),
                _fraction(max(ys), height),
                round(float(score), 4),
            )
        )
    return lines


def _fraction(value: float, size: int) -> float:
    return round(min(max(value / size, 0.0), 1.0), 5)


def layout(lines: Sequence[OcrLine], carried_columns: int = 0) -> list[TextBlock | TableBlock]:
    """The page's lines in reading order, as running text and tables (`carried_columns`: the columns of
    the previous page's table, which a lone row first on this page may continue)."""
    if not lines:
        return []
    height = _line_height(lines)
    return [_block(part, height) for part in _parts(lines, height, carried_columns)]


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Running text of a page and one box per OCR line, offsets relative to that text."""

    text: str
    boxes: list[TextBox]


@dataclass(frozen=True, slots=True)
class TableBlock:
    """A table of a page: its rows of OCR lines in reading order, and the short line just above as caption."""

    rows: list[list[OcrLine]]
    caption: OcrLine | None = None


@dataclass(frozen=True, slots=True)
class _Part:
    """A run of a page's rows in reading order: text, or a table (with the line just above as caption)."""

    rows: list[list[OcrLine]]
    table: bool = False
    caption: OcrLine | None = None


_Run = tuple[bool, list[list[OcrLine]]]  # rows in a row that all hold several cells (True) or all one


def _line_height(lines: Sequence[OcrLine]) -> float:
    return statistics.median(line.height for line in lines) or 0.01


def _block(part: _Part, height: float) -> TextBlock | TableBlock:
    if part.table:
        return TableBlock(part.rows, part.caption)
    return TextBlock(*_text(part.rows, height))


def _parts(lines: Sequence[OcrLine], height: float, carried_columns: int = 0) -> list[_Part]:
    """The page's rows as text and tables: a table is two or more rows of several cells in a row whose
    boxes make two columns or more (`tables.grid`), or one such row first on the page with as many
    columns as the previous page's table (`carried_columns`: its last row); a row of one cell between
    such rows belongs to the table when the columns stay apart with it (`_bridged`)."""
    parts: list[_Part] = []
    for multi, run in _bridged(_runs(_rows_in_reading_order(lines, height))):
        if multi and _is_table(run, not parts, carried_columns):
            parts.append(_table_part(parts, run, height))
        elif parts and not parts[-1].table:
            parts[-1].rows.extend(run)
        else:
            parts.append(_Part(list(run)))
    return parts


def _runs(rows: list[list[OcrLine]]) -> list[_Run]:
    """The rows in runs of rows of several cells and runs of rows of one."""
    return [(multi, list(run)) for multi, run in itertools.groupby(rows, key=lambda row: len(row) > 1)]


def _bridged(runs: list[_Run]) -> list[_Run]:
    """`runs` with each row of one cell between runs of several cells joined to them when the columns stay
    apart with it (a cell on two lines, a row with one cell filled)."""
    merged: list[_Run] = []
    for i, (multi, run) in enumerate(runs):
        after = runs[i + 1][1] if i + 1 < len(runs) else None
        if merged and merged[-1][0] and (multi or _bridges(merged[-1][1], run, after)):
            merged[-1][1].extend(run)
        else:
            merged.append((multi, list(run)))
    return merged


def _bridges(before: list[list[OcrLine]], run: list[list[OcrLine]], after: list[list[OcrLine]] | None) -> bool:
    """Whether the one row `run` between two runs of several cells keeps their columns apart."""
    return len(run) == 1 and after is not None and _keeps_columns(before, run, after)


def _is_table(run: list[list[OcrLine]], first_on_page: bool, carried_columns: int) -> bool:
    """Rows of several cells in two columns or more: two rows or more, or one first on its page that
    has as many columns as the previous page's table."""
    columns = _column_count(run)
    return columns > 1 and (len(run) >= 2 or (first_on_page and columns == carried_columns))


def _table_part(parts: list[_Part], run: list[list[OcrLine]], height: float) -> _Part:
    """The table of `run`, under the last line of the text before it when that line is its caption (the
    line is taken from the text, and a text part left empty goes)."""
    caption = None
    if parts and not parts[-1].table and _is_caption(parts[-1].rows[-1], run[0], height):
        caption = parts[-1].rows.pop()[0]
        if not parts[-1].rows:
            parts.pop()
    return _Part(run, table=True, caption=caption)


def _column_count(rows: Sequence[Sequence[OcrLine]]) -> int:
    cells = grid(rows)
    return len(cells[0]) if cells else 0


def _keeps_columns(before: list[list[OcrLine]], row: list[list[OcrLine]], after: list[list[OcrLine]]) -> bool:
    return _column_count([*before, *row, *after]) >= max(_column_count(before), _column_count(after)) > 1


def _is_caption(row: list[OcrLine], first: list[OcrLine], height: float) -> bool:
    """A short line of its own just above a table's first row."""
    return (
        len(row) == 1
        and len(row[0].text) <= _CAPTION_CHARS
        and min(x.y0 for x in first) - row[0].y1 <= _CAPTION_GAP * height
    )


def _text(rows: list[list[OcrLine]], height: float) -> tuple[str, list[TextBox]]:
    """Rows in reading order as running text (see the module docstring), a box per line."""
    parts: list[str] = []
    boxes: list[TextBox] = []
    length = 0
    previous: list[OcrLine] | None = None
    for row in rows:
        if previous is not None:
            sep = _row_separator(previous, row, height)
            parts.append(sep)
            length += len(sep)
        for i, line in enumerate(row):
            if i:
                sep = _joiner(row[i - 1], line)
                parts.append(sep)
                length += len(sep)
            parts.append(line.text)
            boxes.append(_box(length, length + len(line.text), line))
            length += len(line.text)
        previous = row
    return "".join(parts), boxes


def _row_separator(previous: list[OcrLine], row: list[OcrLine], height: float) -> str:
    """What goes between two rows of running text: a paragraph break, a line break, nothing or a space."""
    gap = row[0].y0 - max(line.y1 for line in previous)
    if gap > height or gap < -height:  # a blank line's gap, or a jump up to the next column
        return "\n\n"
    if len(row) > 1 or len(previous) > 1:
        return "\n"  # the cells of a row of several keep their row
    if _breaks_a_chinese_word(previous[-1].text, row[0].text):
        return ""  # Chinese wraps between any two characters, digits and Latin letters too
    return _joiner(previous[-1], row[0])


def _breaks_a_chinese_word(before: str, after: str) -> bool:
    """Whether the word a line ends with or the next begins with holds a CJK character: Chinese has no
    spaces, so "准决赛阶段16" / "名运动员" and "博尔特;zh" / "-tw:柏特" run on, while "Tokyo (東京), home" / "to"
    are English words with a gloss."""
    last, first = before.rsplit(None, 1)[-1:], after.split(None, 1)[:1]
    return has_cjk("".join(last + first))


def _joiner(before: OcrLine, after: OcrLine) -> str:
    """Nothing next to a Chinese character ("16" and "名" read as two boxes are "16名"), else a space."""
    return "" if is_cjk(after.text[:1]) or is_cjk(before.text[-1:]) else " "


def _rows_in_reading_order(lines: Sequence[OcrLine], height: float) -> list[list[OcrLine]]:
    left = min(line.x0 for line in lines)
    width = (max(line.x1 for line in lines) - left) or 1.0
    rows: list[list[OcrLine]] = []
    band: list[OcrLine] = []
    for line in sorted(lines, key=lambda line: line.middle):
        if (line.x1 - line.x0) / width >= _SPANNING:
            rows += _band_rows(band, width, height)
            rows += _group_rows([line], height)
            band = []
        else:
            band.append(line)
    return rows + _band_rows(band, width, height)


def _band_rows(band: list[OcrLine], width: float, height: float) -> list[list[OcrLine]]:
    columns = _columns(band, width)
    if len(columns) > 1 and all(
        (max(x.x1 for x in c) - c[0].x0) / width >= _MIN_COLUMN and len(c) >= _MIN_COLUMN_LINES for c in columns
    ):
        return [row for column in columns for row in _group_rows(column, height)]
    return _group_rows(band, height)


def _columns(band: list[OcrLine], width: float) -> list[list[OcrLine]]:
    """The band's lines split at x gutters that no line crosses, left to right (each sorted by x0)."""
    columns: list[list[OcrLine]] = []
    right = -1.0
    for line in sorted(band, key=lambda line: line.x0):
        if columns and line.x0 < right + 0.01 * width:
            columns[-1].append(line)
        else:
            columns.append([line])
        right = max(right, line.x1)
    return columns


def _group_rows(lines: list[OcrLine], height: float) -> list[list[OcrLine]]:
    """Lines at the same height (middles within half a line) as rows, top to bottom, each left to right."""
    rows: list[list[OcrLine]] = []
    for line in sorted(lines, key=lambda line: line.middle):
        if rows and abs(line.middle - statistics.fmean(x.middle for x in rows[-1])) < height / 2:
            rows[-1].append(line)
        else:
            rows.append([line])
    return [sorted(row, key=lambda line: line.x0) for row in rows]


def add_ocr_page(
    builder: DocumentBuilder,
    number: int,
    image: Any,
    ocr: OcrFn,
    min_confidence: float,
    carry: TableCarry | None = None,
) -> list[str]:
    """Reads page `number` through `ocr` into `builder`, its tables as tables (`carry`: what the previous
    page's table left, see `tables.TableCarry`); the warnings it leaves (a skipped page, doubtful lines)."""
    return add_read_page(builder, number, read_page(image, ocr), min_confidence, carry)


def announce_pages(ocr: OcrFn, total: int) -> None:
    """Tells `ocr` how many page images the document is about to send it, where it counts them for
    progress ("page 3 of 25": the parser worker's OCR function does); a plain function is left alone."""
    expect = getattr(ocr, "expect_pages", None)
    if expect is not None:
        expect(total)


def read_page(image: Any, ocr: OcrFn) -> PageRead:
    """The lines `ocr` reads on a page, or why it did not (a document's pages are read before they are
    laid out, so that what repeats on every page is known: see `ingest.loaders.furniture`)."""
    if _blank(image):
        return PageLines([])
    return ocr(image)


def add_read_page(
    builder: DocumentBuilder,
    number: int,
    page: PageRead,
    min_confidence: float,
    carry: TableCarry | None = None,
) -> list[str]:
    """`add_ocr_page` of a page read already (`read_page`)."""
    builder.page(number)
    if isinstance(page, PageLeftOut):
        return [f"page {number} was left out: {page.why}"]
    carry = carry if carry is not None else TableCarry()
    for n, block in enumerate(layout(page.lines, len(carry.header or ()))):
        if isinstance(block, TableBlock):
            _add_table(builder, block, carry, first_on_page=n == 0)
        else:
            builder.block(block.text, boxes=block.boxes)
    return _doubtful(number, page.lines, min_confidence)


def _doubtful(number: int, lines: list[OcrLine], min_confidence: float) -> list[str]:
    """The warning for page `number` when some of its lines read with a low confidence."""
    doubtful = sum(1 for line in lines if line.confidence < min_confidence)
    if doubtful:
        return [f"page {number}: {doubtful} of {len(lines)} OCR lines read with confidence under {min_confidence:g}"]
    return []


def _blank(image: Any) -> bool:
    """A page too small to hold a line of text, or of one grey: nothing to read, so no OCR to pay."""
    shape = getattr(image, "shape", None)
    if shape is None or len(shape) < 2:
        return False
    return bool(min(shape[:2]) < MIN_TEXT_SIDE or image.min() == image.max())


def _add_table(builder: DocumentBuilder, part: TableBlock, carry: TableCarry, first_on_page: bool) -> None:
    """A scanned table as markdown under its caption (the top row as header), a box per OCR line."""
    cells = grid(part.rows) or []
    rows = [[_cell(lines) for lines in row] for row in cells]
    caption = part.caption.text if part.caption is not None else ""
    rows, caption, added = carry.follow(rows, caption, first_on_page)
    md = markdown_table(rows, caption or None)
    if md is None:
        return
    boxes = _cell_boxes(md.cell_spans, md.rows, cells, added)
    if part.caption is not None and caption:
        boxes.append(_box(0, len(md.text.split("\n", 1)[0]), part.caption))
    builder.table(md.text, md.header, boxes=sorted(boxes, key=lambda b: (b.start, b.y0)))


def _cell_boxes(
    spans: Sequence[Sequence[tuple[int, int]]], sources: Sequence[int], cells: list[list[list[OcrLine]]], added: bool
) -> list[TextBox]:
    """A box per OCR line over the text of its cell (`sources`: the row of `cells` each markdown row
    shows; the header carried from the previous page, `added`, has no lines here)."""
    return [
        _box(start, end, line)
        for row_spans, source in zip(spans, sources, strict=True)
        if not (added and source == 0)
        for (start, end), lines in zip(row_spans, cells[source - added], strict=True)
        for line in lines
    ]


def _cell(lines: list[OcrLine]) -> str:
    """A cell's lines (two on one line when OCR split it), top to bottom, as one line of text."""
    ordered = sorted(lines, key=lambda line: (line.middle, line.x0))
    return "".join((_joiner(ordered[i - 1], line) if i else "") + line.text for i, line in enumerate(ordered))


def _box(start: int, end: int, line: OcrLine) -> TextBox:
    return TextBox(start, end, line.x0, line.y0, line.x1, line.y1, line.confidence)


def ocr_flags(doc: LoadedDocument, chunk: Mapping[str, Any], min_confidence: float) -> dict[str, int]:
    """For a chunk of OCR text (its metadata: page, start, end): how many OCR lines it holds, and how many
    of them read with a confidence under `min_confidence`, so that doubtful text is never shown as fact
    unmarked. Empty for text that did not come from OCR."""
    start, end, page = chunk.get("start"), chunk.get("end"), chunk.get("page")
    if not isinstance(start, int) or not isinstance(end, int):
        return {}
    scores = [
        box.confidence
        for section in doc.sections
        if section.page == page
        for box in section.boxes or ()
        if box.confidence is not None and box.start < end and box.end > start
    ]
    if not scores:
        return {}
    return {"ocr_lines": len(scores), "ocr_low_confidence": sum(1 for score in scores if score < min_confidence)}
