"""Tables as markdown: one shape for the tables of every format (PDF, DOCX, HTML, OCR).

    md = markdown_table(rows, caption="Table 2: Prices")
    builder.table(md.text, md.header, boxes=...)

The first row is the header. The text is the caption line (if any), the header row, the markdown
separator and one line per data row, so `md.text[:len(md.header)]` is what a chunk of later rows
repeats (see `ingest.chunking`): a chunk of rows 40-60 still names its columns.

`align_rows` turns OCR line boxes into table rows by their positions, and `table_from_boxes` into a
markdown table, for a scanned table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ._builder import clean

_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class MarkdownTable:
    """A table in markdown; `header` (caption, header row, separator) is a prefix of `text`.

    `row_spans` are the (start, end) offsets in `text` of each row line, the header row first, and
    `rows` the index in the input of the row each line shows (empty rows are dropped).
    """

    text: str
    header: str
    row_spans: tuple[tuple[int, int], ...]
    rows: tuple[int, ...]


def cell_text(value: object) -> str:
    """A cell on one markdown line: whitespace collapsed, pipes escaped."""
    return _SPACE.sub(" ", clean("" if value is None else str(value))).strip().replace("|", "\\|")


def markdown_table(rows: Sequence[Sequence[object]], caption: str | None = None) -> MarkdownTable | None:
    """The rows (the first is the header) as a markdown table; None when no cell holds text.

    Empty rows are dropped and short rows padded, so every line has the header's columns.
    """
    indexed = [(i, [cell_text(c) for c in row]) for i, row in enumerate(rows)]
    indexed = [(i, row) for i, row in indexed if any(row)]
    cells = [row for _, row in indexed]
    if not cells:
        return None
    width = max(len(row) for row in cells)
    cells = [row + [""] * (width - len(row)) for row in cells]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    parts: list[str] = []
    caption = _SPACE.sub(" ", clean(caption or "")).strip()
    if caption:
        parts.append(caption)
    spans: list[tuple[int, int]] = []
    offset = len(caption) + 1 if caption else 0
    separator = "| " + " | ".join(["---"] * width) + " |"
    for i, line in enumerate(lines):
        spans.append((offset, offset + len(line)))
        parts.append(line)
        offset += len(line) + 1
        if i == 0:
            parts.append(separator)
            offset += len(separator) + 1
    text = "\n".join(parts)
    header_end = spans[0][1] + 1 + len(separator)
    return MarkdownTable(text=text, header=text[:header_end], row_spans=tuple(spans), rows=tuple(i for i, _ in indexed))


@dataclass(frozen=True, slots=True)
class LineBox:
    """A line of OCR text and its box (any unit, top-left origin)."""

    text: str
    x0: float
    y0: float
    x1: float
    y1: float


def align_rows(lines: Sequence[LineBox], min_columns: int = 2) -> list[list[str]] | None:
    """The table that OCR line boxes make when they line up, as rows of cells; None when they do not.

    Our own alignment, not img2table (which wants the page image and opencv): a box joins the row whose
    vertical span it overlaps by more than half the smaller height; columns are the clusters of the
    boxes' horizontal spans over all rows (overlapping spans are one column). It is a table when at
    least two rows have `min_columns` or more cells; a row's cells are placed in their columns, empty
    where a row has nothing.
    """
    rows: list[list[LineBox]] = []
    for box in sorted(lines, key=lambda b: ((b.y0 + b.y1) / 2, b.x0)):
        row = rows[-1] if rows else None
        if row is not None and _same_row(row, box):
            row.append(box)
        else:
            rows.append([box])
    if sum(1 for row in rows if len(row) >= min_columns) < 2:
        return None
    columns = _columns([b for row in rows for b in row])
    table = []
    for row in rows:
        cells = [""] * len(columns)
        for box in sorted(row, key=lambda b: b.x0):
            col = next(i for i, (a, b) in enumerate(columns) if box.x0 <= b and box.x1 >= a)
            cells[col] = f"{cells[col]} {box.text}".strip()
        table.append(cells)
    return table


def table_from_boxes(
    lines: Sequence[LineBox], caption: str | None = None, min_columns: int = 2
) -> MarkdownTable | None:
    """OCR lines that line up as a markdown table (the top row as header), or None (see `align_rows`)."""
    rows = align_rows(lines, min_columns)
    return markdown_table(rows, caption) if rows is not None else None


def _same_row(row: list[LineBox], box: LineBox) -> bool:
    top, bottom = min(b.y0 for b in row), max(b.y1 for b in row)
    overlap = min(bottom, box.y1) - max(top, box.y0)
    return overlap > 0.5 * min(bottom - top, box.y1 - box.y0)


def _columns(boxes: list[LineBox]) -> list[tuple[float, float]]:
    spans: list[list[float]] = []
    for box in sorted(boxes, key=lambda b: b.x0):
        if spans and box.x0 <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], box.x1)
        else:
            spans.append([box.x0, box.x1])
    return [(a, b) for a, b in spans]
