"""OCR of one page image: RapidOCR's lines, put in reading order, as page text with a box per line.

    lines = recognize(make_engine(), image)          # in the OCR worker (ingest.ocr_pool)
    text, boxes = layout(lines)                      # anywhere: plain Python

The engine is RapidOCR 3.10 (PP-OCRv6 detection and recognition, Chinese and English in one model;
its 180° line classifier is off, see `make_engine`), run by onnxruntime on one thread; its model files come inside the
`rapidocr` wheel and are pinned in models.lock. A loader does not call the engine itself: it gets an
`OcrFn` (an image in, the lines out), which the parser worker forwards to the OCR worker, so the
OCR of a page has its own time and memory bounds.

Reading order, done here because RapidOCR only sorts lines top to bottom: lines that span most of the
text's width (titles, a one-column body) cut the page into bands; inside a band, lines whose x ranges
leave a gutter free form columns, read one after the other when each is a real column (wide and at
least three lines tall; narrower ones are table cells and are read row by row). Segments at the same
height join into one row; a vertical gap of more than a line's height starts a paragraph. The lines of
a paragraph are joined as running text (a space, or nothing between Chinese characters), since a line
break inside a sentence would split the phrases that search and answers quote; rows of several cells
(a table) keep a line each.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import LoadedDocument, TextBox
from ._builder import DocumentBuilder, clean

MAX_SIDE = 2000  # pixels on an image's long side that the detector reads (RapidOCR's default): larger is downscaled
_SPANNING = 0.55  # a line this share of the text's width or wider spans every column
_MIN_COLUMN = 0.2  # a column is at least this share of the text's width...
_MIN_COLUMN_LINES = 3  # ...and this many lines tall
_CJK = re.compile(r"[\u3000-\u30ff\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]")


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


class PageSkipped(Exception):
    """The OCR of a page did not finish (over its time or memory): the page is left out, with a warning."""


OcrFn = Callable[[Any], list[OcrLine]]  # a 2-D uint8 image (grayscale) in, its lines out; may raise PageSkipped


def make_engine(threads: int = 1) -> Any:
    """A RapidOCR engine on the models inside the wheel, `threads` onnxruntime threads, quiet."""
    from rapidocr import RapidOCR

    return RapidOCR(
        params={
            "Global.log_level": "error",  # "the text detection result is empty" is no news
            "Global.max_side_len": MAX_SIDE,
            # The 180-degree line classifier turned upright lines of our scans over (3 of 11 lines of a
            # SQuAD page read as garbage, scores ~0.6); without it all 11 read right. Pages come upright
            # (EXIF for photos); an upside-down scan is read badly and flagged by its low scores.
            "Global.use_cls": False,
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
    )


def recognize(engine: Any, image: Any) -> list[OcrLine]:
    """The lines `engine` reads in `image` (a numpy array), boxes as fractions of the image."""
    height, width = image.shape[:2]
    result = engine(image)
    if result.boxes is None or result.txts is None or result.scores is None:
        return []
    lines = []
    for box, text, score in zip(result.boxes, result.txts, result.scores, strict=True):
        text = clean(str(text)).strip()
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


def layout(lines: Sequence[OcrLine]) -> tuple[str, list[TextBox]]:
    """The page's text in reading order and one box per OCR line, offsets relative to that text."""
    if not lines:
        return "", []
    height = statistics.median(line.height for line in lines) or 0.01
    parts: list[str] = []
    boxes: list[TextBox] = []
    length = 0
    previous: list[OcrLine] | None = None
    for row in _rows_in_reading_order(lines, height):
        if previous is not None:
            gap = row[0].y0 - max(line.y1 for line in previous)
            if gap > height or gap < -height:  # a blank line's gap, or a jump up to the next column
                sep = "\n\n"
            elif len(row) > 1 or len(previous) > 1:
                sep = "\n"  # the cells of a table row keep their row
            else:
                sep = "" if _CJK.search(previous[-1].text[-1]) and _CJK.match(row[0].text) else " "
            parts.append(sep)
            length += len(sep)
        for i, line in enumerate(row):
            if i:
                sep = "" if _CJK.match(line.text) and _CJK.search(row[i - 1].text[-1]) else " "
                parts.append(sep)
                length += len(sep)
            parts.append(line.text)
            boxes.append(TextBox(length, length + len(line.text), line.x0, line.y0, line.x1, line.y1, line.confidence))
            length += len(line.text)
        previous = row
    return "".join(parts), boxes


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


def add_ocr_page(builder: DocumentBuilder, number: int, image: Any, ocr: OcrFn, min_confidence: float) -> list[str]:
    """Reads page `number` through `ocr` into `builder`; the warnings it leaves (a skipped page, doubtful lines)."""
    builder.page(number)
    try:
        lines = ocr(image)
    except PageSkipped as exc:
        return [f"page {number} was left out: {exc}"]
    text, boxes = layout(lines)
    builder.block(text, boxes=boxes)
    doubtful = sum(1 for line in lines if line.confidence < min_confidence)
    if doubtful:
        return [f"page {number}: {doubtful} of {len(lines)} OCR lines read with confidence under {min_confidence:g}"]
    return []


def ocr_flags(doc: LoadedDocument, chunk: Mapping[str, Any], min_confidence: float) -> dict[str, int]:
    """For a chunk of OCR text (its metadata: page, start, end): how many OCR lines it holds, and how many
    of them read with a confidence under `min_confidence`, so that doubtful text is never shown as fact
    unmarked. Empty for text that did not come from OCR."""
    start, end, page = chunk.get("start"), chunk.get("end"), chunk.get("page")
    scores = [
        box.confidence
        for section in doc.sections
        if section.page == page and section.boxes
        for box in section.boxes
        if box.confidence is not None
        and isinstance(start, int)
        and isinstance(end, int)
        and box.start < end
        and box.end > start
    ]
    if not scores:
        return {}
    return {"ocr_lines": len(scores), "ocr_low_confidence": sum(1 for score in scores if score < min_confidence)}
