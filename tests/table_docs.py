"""Generated documents with tables: ruled PDF tables (Helvetica, Latin-1) that run over pages, for
the loader tests and `bench/tables.py`."""

from __future__ import annotations

from collections.abc import Sequence

from tests.hostile import PdfWriter, _pdf_string

PAGE_TOP = 740
PAGE_BOTTOM = 60
ROW_HEIGHT = 16


def _text(x: float, y: float, size: int, text: str) -> bytes:
    return b"BT /F1 %d Tf %.1f %.1f Td " % (size, x, y) + _pdf_string(text) + b" Tj ET"


def _table_ops(
    header: Sequence[str] | None, rows: Sequence[Sequence[str]], top: float, widths: Sequence[float]
) -> bytes:
    xs = [72.0]
    for w in widths:
        xs.append(xs[-1] + w)
    body = ([list(header)] if header is not None else []) + [list(r) for r in rows]
    bottom = top - ROW_HEIGHT * len(body)
    ops = [b"0.5 w"]
    for i in range(len(body) + 1):
        y = top - ROW_HEIGHT * i
        ops.append(b"%.1f %.1f m %.1f %.1f l S" % (xs[0], y, xs[-1], y))
    for x in xs:
        ops.append(b"%.1f %.1f m %.1f %.1f l S" % (x, top, x, bottom))
    for i, row in enumerate(body):
        y = top - ROW_HEIGHT * (i + 1) + 4.5
        for j, cell in enumerate(row):
            ops.append(_text(xs[j] + 3, y, 9, cell))
    return b"\n".join(ops)


def table_pdf(
    caption: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    intro: str = "",
    outro: str = "",
    widths: Sequence[float] | None = None,
    repeat_header: bool = False,
) -> bytes:
    """A PDF of one ruled table under its caption, continued over as many pages as its rows need (the
    header only on the first page unless `repeat_header`), with a line of text before and after."""
    widths = list(widths or [468 / len(header)] * len(header))
    writer = PdfWriter()
    ops: list[bytes] = []
    y = PAGE_TOP
    if intro:
        ops.append(_text(72, y, 11, intro))
        y -= 24
    ops.append(_text(72, y, 12, caption))
    y -= 8
    first, remaining = True, list(rows)
    while remaining:
        with_header = first or repeat_header
        fit = int((y - PAGE_BOTTOM) // ROW_HEIGHT) - (1 if with_header else 0)
        part, remaining = remaining[:fit], remaining[fit:]
        ops.append(_table_ops(header if with_header else None, part, y, widths))
        y -= ROW_HEIGHT * (len(part) + (1 if with_header else 0))
        if remaining:
            writer.add_page(b"\n".join(ops))
            ops, y, first = [], PAGE_TOP, False
    if outro:
        ops.append(_text(72, y - 24, 11, outro))
    writer.add_page(b"\n".join(ops))
    return writer.build()
