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

The reading order and the tables of a page's lines are `_ocr_layout`'s (`layout`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import LoadedDocument, TextBox
from ._builder import DocumentBuilder, clean
from ._ocr_layout import OcrLine, TableBlock, TextBlock, joiner, layout, line_box
from .tables import TableCarry, grid, markdown_table
from .word_spaces import spaced

__all__ = [
    "MAX_SIDE",
    "MIN_TEXT_SIDE",
    "OcrFn",
    "OcrLine",
    "PageLeftOut",
    "PageLines",
    "PageRead",
    "TableBlock",
    "TextBlock",
    "add_ocr_page",
    "add_read_page",
    "announce_pages",
    "layout",
    "make_engine",
    "ocr_flags",
    "read_page",
    "recognize",
]

MAX_SIDE = 2000  # pixels on an image's long side that the detector reads (RapidOCR's default): larger is downscaled
# A page narrower or lower than this holds no line OCR could read: it is not sent (each call costs about
# 1.5 s whatever the size, so 180 pages of 1 x 1 pixel cost 327 s); nor is a page of one grey.
MIN_TEXT_SIDE = 8


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
        boxes.append(line_box(0, len(md.text.split("\n", 1)[0]), part.caption))
    builder.table(md.text, md.header, boxes=sorted(boxes, key=lambda b: (b.start, b.y0)))


def _cell_boxes(
    spans: Sequence[Sequence[tuple[int, int]]], sources: Sequence[int], cells: list[list[list[OcrLine]]], added: bool
) -> list[TextBox]:
    """A box per OCR line over the text of its cell (`sources`: the row of `cells` each markdown row
    shows; the header carried from the previous page, `added`, has no lines here)."""
    return [
        line_box(start, end, line)
        for row_spans, source in zip(spans, sources, strict=True)
        if not (added and source == 0)
        for (start, end), lines in zip(row_spans, cells[source - added], strict=True)
        for line in lines
    ]


def _cell(lines: list[OcrLine]) -> str:
    """A cell's lines (two on one line when OCR split it), top to bottom, as one line of text."""
    ordered = sorted(lines, key=lambda line: (line.middle, line.x0))
    return "".join((joiner(ordered[i - 1], line) if i else "") + line.text for i, line in enumerate(ordered))


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
