"""Tables stay tables: PDF, DOCX and HTML tables, and tables in scans, become markdown rows, and every
chunk of a long table names its columns; PDF text lines carry their boxes on the page."""

from __future__ import annotations

import json

import pytest

from ingest.chunking import Chunker, chunk_document
from ingest.loaders import parse
from ingest.loaders.ocr import OcrLine
from ingest.loaders.tables import grid, markdown_table
from ingest.loading import load_document
from ingest.models import MAX_CHUNK_BOXES, DocKind, TextBox, decode_boxes, encode_boxes
from rag.core.config import Settings
from tests import hostile, scans
from tests.table_docs import table_pdf

HEADER = ["Item", "Price", "Stock", "Depot"]
ROWS = [[f"Widget {i}", f"{i * 1.5:.2f}", str(i * 3), "Lyon" if i % 2 else "Oslo"] for i in range(90)]


def words(text: str) -> int:
    return len(text.split())


def test_markdown_table_has_caption_header_and_one_line_a_row() -> None:
    table = markdown_table([["Name", "Note"], ["a|b", "two\nlines"], ["", ""], ["short"]], caption="Table 1:  Notes")
    assert table is not None
    assert table.text == "Table 1: Notes\n| Name | Note |\n| --- | --- |\n| a\\|b | two lines |\n| short |  |"
    assert table.header == "Table 1: Notes\n| Name | Note |\n| --- | --- |"
    assert [table.text[s:e] for s, e in table.row_spans] == ["| Name | Note |", "| a\\|b | two lines |", "| short |  |"]
    assert table.rows == (0, 1, 3)
    assert [[table.text[s:e] for s, e in row] for row in table.cell_spans] == [
        ["Name", "Note"],
        ["a\\|b", "two lines"],
        ["short", ""],
    ]
    assert markdown_table([["", None]]) is None


def test_a_long_pdf_table_keeps_its_header_in_every_chunk() -> None:
    doc = parse(
        DocKind.PDF,
        table_pdf("Table 4: Stock by item", HEADER, ROWS, intro="December stock.", outro="End."),
        "stock.pdf",
    )
    tables = [s for s in doc.sections if s.table_header]
    assert [s.page for s in tables] == [1, 2, 3]  # the table runs over three pages
    assert (
        tables[0].table_header == "Table 4: Stock by item\n| Item | Price | Stock | Depot |\n| --- | --- | --- | --- |"
    )
    # Pages 2 and 3 draw no header row: they get the first page's.
    assert tables[1].table_header.startswith("Table 4: Stock by item (continued)\n| Item | Price | Stock | Depot |")
    assert doc.sections[0].text == "December stock." and doc.sections[-1].text == "End."
    rows = [line for s in tables for line in s.text.splitlines() if line.startswith("| Widget")]
    assert rows[0] == "| Widget 0 | 0.00 | 0 | Oslo |" and len(rows) == 90

    chunks = chunk_document(doc, "d", Chunker(words, chunk_tokens=60, chunk_overlap=8))
    table_chunks = [c for c in chunks if "| Widget" in c.text]
    assert len(table_chunks) > 6
    for chunk in table_chunks:
        assert "| Item | Price | Stock | Depot |" in chunk.text.splitlines()[1]
        assert chunk.text == chunk.lead + doc.text[chunk.start : chunk.end]
        assert chunk.n_tokens <= 60
    # Rows are never cut, and each row is in exactly one chunk.
    held = [line for c in table_chunks for line in c.text.splitlines() if line.startswith("| Widget")]
    assert held == rows


def test_a_table_that_fits_stays_one_chunk() -> None:
    doc = parse(DocKind.PDF, table_pdf("Prices", ["Item", "Price"], [["Tea", "3"], ["Cake", "4"]]), "p.pdf")
    chunks = chunk_document(doc, "d", Chunker(words, chunk_tokens=200, chunk_overlap=8))
    assert [c.text for c in chunks] == ["Prices\n| Item | Price |\n| --- | --- |\n| Tea | 3 |\n| Cake | 4 |"]
    assert chunks[0].lead == ""


def test_pdf_text_lines_and_table_rows_have_boxes_on_their_page() -> None:
    doc = parse(DocKind.PDF, hostile.text_pdf([["First line", "Second line"], ["Other page"]]), "x.pdf")
    first = doc.sections[0]
    assert [doc.text[b.start : b.end] for b in first.boxes] == ["First line", "Second line"]
    top = first.boxes[0]
    # Helvetica 12 at x=72, y=720 on a 612 x 792 page: the box in fractions, from the top left.
    assert top.x0 == pytest.approx(72 / 612, abs=0.01) and top.y1 == pytest.approx((792 - 720) / 792, abs=0.01)
    assert first.boxes[1].y0 > top.y0 and top.confidence is None

    doc = parse(DocKind.PDF, table_pdf("Prices", ["Item", "Price"], [["Tea", "3"], ["Cake", "4"]]), "p.pdf")
    table = next(s for s in doc.sections if s.table_header)
    assert [doc.text[b.start : b.end] for b in table.boxes] == ["| Item | Price |", "| Tea | 3 |", "| Cake | 4 |"]
    chunk = chunk_document(doc, "d", Chunker(words, chunk_tokens=200, chunk_overlap=8))[0]
    assert decode_boxes(chunk.metadata()["boxes"]) == [
        [round(v, 4) for v in (b.x0, b.y0, b.x1, b.y1)] for b in table.boxes
    ]


def test_chunk_boxes_stay_compact() -> None:
    boxes = [TextBox(i, i + 1, 0.1, i / 500, 0.9, (i + 1) / 500, 0.97) for i in range(500)]
    encoded = encode_boxes(boxes)
    rects = json.loads(encoded)
    assert len(rects) <= MAX_CHUNK_BOXES and len(encoded) < 4000
    assert rects[0][:2] == [0.1, 0.0] and rects[-1][3] == 1.0 and rects[0][4] == 0.97
    assert decode_boxes("not json") == [] and decode_boxes(None) == []


def test_docx_table_takes_its_caption_and_keeps_its_header() -> None:
    data = hostile.docx_document(
        [
            ("heading1", "Stock"),
            ("p", "Intro."),
            ("p", "Table 2: Depots"),
            ("table", [HEADER, *ROWS[:30]]),
            ("p", "After."),
        ]
    )
    doc = parse(DocKind.DOCX, data, "stock.docx")
    table = next(s for s in doc.sections if s.table_header)
    assert table.table_header == "Table 2: Depots\n| Item | Price | Stock | Depot |\n| --- | --- | --- | --- |"
    assert table.headings == ("Stock",)
    chunks = chunk_document(doc, "d", Chunker(words, chunk_tokens=50, chunk_overlap=8))
    assert all(c.text.startswith("Table 2: Depots\n| Item |") for c in chunks if "| Widget" in c.text)
    assert chunks[-1].text == "After."


def test_html_data_table_keeps_its_header_and_layout_tables_stay_text() -> None:
    rows = "".join(f"<tr><td>{r[0]}</td><td>{r[1]}</td></tr>" for r in ROWS[:40])
    page = (
        "<html><body><h1>Prices</h1><table><caption>Price list</caption><thead><tr><th>Item</th><th>Price</th></tr>"
        f"</thead><tbody>{rows}</tbody></table><table><tr><td>Layout only</td></tr></table></body></html>"
    ).encode()
    doc = parse(DocKind.HTML, page, "p.html")
    table = next(s for s in doc.sections if s.table_header)
    assert table.table_header == "Prices\n\nPrice list\n| Item | Price |\n| --- | --- |"
    assert doc.sections[-1].text == "Layout only"
    chunks = chunk_document(doc, "d", Chunker(words, chunk_tokens=40, chunk_overlap=8))
    assert all("| Item | Price |" in c.text for c in chunks if "Widget" in c.text)


def test_ocr_boxes_that_line_up_make_columns() -> None:
    def box(text: str, x0: float, x1: float) -> OcrLine:
        return OcrLine(text, x0, 0.0, x1, 0.01, 0.99)

    name, age, city = box("Name", 10, 50), box("Age", 100, 130), box("City", 200, 240)
    bob, bob2, oslo = box("Bob", 12, 30), box("Smith", 33, 60), box("Oslo", 201, 235)
    assert grid([[name, age, city], [bob, bob2, oslo]]) == [[[name], [age], [city]], [[bob, bob2], [], [oslo]]]
    # A box across the gap joins the columns: running text, not a table.
    assert grid([[box("The lease of the mill", 10, 120), box("runs on", 130, 200)], [box("and on", 10, 150)]]) is None


def test_a_scanned_price_list_is_read_by_ocr_as_rows_that_keep_their_header() -> None:
    rows = [[f"Kettle {i}", f"{20 + i * 1.25:.2f} EUR", str(i * 7 % 50)] for i in range(40)]
    printed = table_pdf("Table 5: Kettles", ["Item", "Price", "Stock"], rows, intro="Kettles in stock.", outro="End.")
    doc = load_document(scans.scan_of_pdf(printed, seed=3), "kettles-scan.pdf", Settings())
    tables = [s for s in doc.sections if s.table_header]
    assert [s.page for s in tables] == [1, 2]  # 39 rows on the first page, 1 on the second
    assert tables[0].table_header == "Table 5: Kettles\n| Item | Price | Stock |\n| --- | --- | --- |"
    assert tables[1].table_header == "Table 5: Kettles (continued)\n| Item | Price | Stock |\n| --- | --- | --- |"
    read = [line for s in tables for line in s.text.splitlines()[len(s.table_header.splitlines()) :]]
    assert read == ["| " + " | ".join(row) + " |" for row in rows]
    assert all(b.confidence is not None and b.confidence > 0.8 for s in tables for b in s.boxes)

    chunks = chunk_document(doc, "d", Chunker(words, chunk_tokens=60, chunk_overlap=8))
    with_rows = [c for c in chunks if "| Kettle" in c.text]
    assert len(with_rows) > 3
    assert all(c.text.splitlines()[1] == "| Item | Price | Stock |" for c in with_rows)


def test_table_detection_has_a_time_budget_per_document(monkeypatch: pytest.MonkeyPatch) -> None:
    from ingest.loaders import pdf_layout

    monkeypatch.setattr(pdf_layout, "TABLE_BUDGET_S", -1.0)  # spent before the first page
    doc = parse(DocKind.PDF, table_pdf("Prices", ["Item", "Price"], [["Tea", "3"], ["Cake", "4"]]), "p.pdf")
    assert not any(s.table_header for s in doc.sections)
    assert "Tea" in doc.text and "Cake" in doc.text  # the cells are still read, as text
