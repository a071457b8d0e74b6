"""The layout of a page's OCR lines: reading order, running text and tables (`layout`; re-exported by
`ingest.loaders.ocr`, whose `add_read_page` is its production caller).

    blocks = layout(lines)   # the lines in reading order: TextBlock, TableBlock

Reading order is done here because RapidOCR only sorts lines top to bottom: lines that span most of the
text's width (titles, a one-column body) cut the page into bands; inside a band, lines whose x ranges
leave a gutter free form columns, read one after the other when each is a real column (wide and at
least three lines tall; narrower ones are table cells and are read row by row). Segments at the same
height join into one row; a vertical gap of more than a line's height starts a paragraph. The lines of
a paragraph are joined as running text (a space; nothing next to a Chinese character, nor where the break
falls inside a word of Chinese text, which wraps anywhere, inside a number too), since a line break inside a
sentence would split the phrases that search and answers quote.

Tables: two or more rows of several cells whose boxes line up in two columns or more (`tables.grid`)
are a table (a `TableBlock`, with the short line just above it as its caption), or one such row first on
its page with as many columns as the previous page's table; `ingest.loaders.ocr` writes it as markdown
with its top row as the header, as a born-digital table is, so every chunk of its rows repeats the header,
and a table first on its page without a caption continues the previous page's (`tables.TableCarry`).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from rag.core.cjk import has_cjk, is_cjk

from ..models import TextBox
from .tables import grid

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
                sep = joiner(row[i - 1], line)
                parts.append(sep)
                length += len(sep)
            parts.append(line.text)
            boxes.append(line_box(length, length + len(line.text), line))
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
    return joiner(previous[-1], row[0])


def _breaks_a_chinese_word(before: str, after: str) -> bool:
    """Whether the word a line ends with or the next begins with holds a CJK character: Chinese has no
    spaces, so "准决赛阶段16" / "名运动员" and "博尔特;zh" / "-tw:柏特" run on, while "Tokyo (東京), home" / "to"
    are English words with a gloss."""
    last, first = before.rsplit(None, 1)[-1:], after.split(None, 1)[:1]
    return has_cjk("".join(last + first))


def joiner(before: OcrLine, after: OcrLine) -> str:
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


def line_box(start: int, end: int, line: OcrLine) -> TextBox:
    """A box over text[start:end] where `line` stands on its page."""
    return TextBox(start, end, line.x0, line.y0, line.x1, line.y1, line.confidence)
