"""Page furniture of scanned pages: page numbers and running headers and footers, kept out of the text.

    pages = without_furniture({1: PageLines(lines_of_page_1), 2: PageLeftOut(why), ...})

OCR reads a page's margins like its body, so a page number ("1", "- 2 -", "Page 3 of 9", "第 4 页") would
become a chunk of its own, and a running header ("Annual Report 2024 — Chapter 2") would be repeated in
the chunks of every page. A line is furniture when it sits in the top or bottom band of its page
(`EDGE`), apart from the body (a gap of at least a line's height to the next line inward), and is
either a page number alone in its row or, after digits are masked, the same text as such an edge line of another page
of the document at the same edge. The gap keeps a table's header row at the top of a page (a table that
goes on over pages) and a short last line of the body where they are.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence

from .ocr import OcrLine, PageLeftOut, PageLines, PageRead

EDGE = 0.12  # the top and bottom bands of a page, as a share of its height, where furniture sits
_GAP = 1.0  # in line heights: furniture stands apart from the body
_PAGE_NUMBER = re.compile(
    r"^(?:[-–—(\[]\s*)?(?:(?:page|p\.|seite|página|第)\s*)?"
    r"(?:\d{1,4}|(?=[ivxlcdm])m{0,3}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3}))(?:\s*(?:/|of|von|de)\s*\d{1,4})?\s*(?:页)?(?:\s*[-–—)\]])?$",
    re.I,
)
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")


def without_furniture(pages: Mapping[int, PageRead]) -> dict[int, PageRead]:
    """The pages' lines less their page numbers and running headers and footers (pages left out as they are)."""
    edges = {n: _edge_lines(page.lines) for n, page in pages.items() if isinstance(page, PageLines)}
    seen = Counter(key for found in edges.values() for key in {_key(line, edge) for line, edge, _ in found})
    out: dict[int, PageRead] = {}
    for number, page in pages.items():
        if isinstance(page, PageLeftOut):
            out[number] = page
            continue
        furniture = {
            id(line)
            for line, edge, alone in edges[number]
            if alone and _PAGE_NUMBER.match(line.text.strip()) or seen[_key(line, edge)] > 1
        }
        out[number] = PageLines([line for line in page.lines if id(line) not in furniture])
    return out


def _edge_lines(lines: Sequence[OcrLine]) -> list[tuple[OcrLine, str, bool]]:
    """The lines of the outermost row at the top and at the bottom, when that row stands apart in its
    band: each with its edge and whether it is alone in its row (a page number is; a table's cell is not)."""
    if len(lines) < 2:
        return [(line, "bottom" if line.y0 > 1 - EDGE else "top", True) for line in lines if _in_band(line)]
    height = statistics.median(line.height for line in lines) or 0.01
    ordered = sorted(lines, key=lambda line: line.middle)
    found: list[tuple[OcrLine, str, bool]] = []
    for edge, row, rest in (("top", *_outer_row(ordered, height)), ("bottom", *_outer_row(ordered[::-1], height))):
        if not rest:
            continue
        apart = (
            min(x.y0 for x in rest) - max(x.y1 for x in row)
            if edge == "top"
            else min(x.y0 for x in row) - max(x.y1 for x in rest)
        )
        if apart >= _GAP * height and all(_in_band(line) for line in row):
            found += [(line, edge, len(row) == 1) for line in row]
    return found


def _outer_row(ordered: list[OcrLine], height: float) -> tuple[list[OcrLine], list[OcrLine]]:
    """The first row of `ordered` (lines within half a line's height of the first) and the other lines."""
    row = [line for line in ordered if abs(line.middle - ordered[0].middle) < height / 2]
    return row, [line for line in ordered if all(line is not x for x in row)]


def _in_band(line: OcrLine) -> bool:
    return line.y1 <= EDGE or line.y0 >= 1 - EDGE


def _key(line: OcrLine, edge: str) -> tuple[str, str]:
    """What repeats from page to page: the text at its edge, digits masked ("Page 3" and "Page 4" are one)."""
    return edge, _SPACE.sub(" ", _DIGITS.sub("#", line.text.casefold())).strip()
