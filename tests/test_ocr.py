"""OCR: reading order of OCR lines, image types from the bytes, bombs and page caps refused before any
decoding or OCR, scanned pages of mixed PDFs, and a page over its time left out with a warning.

The loaders are driven here with a stand-in OCR function (the engine's lines are the input of what is
tested); the one real OCR worker started here is the one whose page runs past its time. The real
engine reads real scans in tests/test_ocr_api.py.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from ingest.chunking import Chunker, chunk_document
from ingest.detect import detect
from ingest.loaders import parse
from ingest.loaders.ocr import OcrLine, PageLeftOut, PageLines, PageRead, TableBlock, TextBlock, layout, ocr_flags
from ingest.models import DocKind, TextBox
from ingest.ocr_pool import OcrPool
from rag.core.errors import DocumentRejected, RagError, UnsupportedFileType
from tests import hostile, scans


class StandInOcr:
    """Answers every page with the same lines, or page n with `pages[n - 1]` (or leaves out the pages
    listed in `skip`); counts calls."""

    def __init__(
        self, lines: list[OcrLine], skip: tuple[int, ...] = (), pages: list[list[OcrLine]] | None = None
    ) -> None:
        self.lines = lines
        self.skip = skip
        self.pages = pages
        self.calls = 0

    def __call__(self, image: object) -> PageRead:
        self.calls += 1
        if self.calls in self.skip:
            return PageLeftOut("OCR did not finish within 1 s (RAG_OCR_PAGE_TIMEOUT_S)")
        return PageLines(self.pages[self.calls - 1] if self.pages is not None else self.lines)


def line(text: str, x0: float, y0: float, x1: float, confidence: float = 0.99) -> OcrLine:
    return OcrLine(text, x0, y0, x1, y0 + 0.02, confidence)


TWO_COLUMNS = [
    line("Right column, first line", 0.55, 0.20, 0.90),
    line("A title across the page", 0.10, 0.05, 0.90),
    line("Left column, first line", 0.10, 0.20, 0.45),
    line("Left column, second line", 0.10, 0.23, 0.45),
    line("Right column, second line", 0.55, 0.23, 0.90),
    line("Left column, third line", 0.10, 0.26, 0.45),
    line("Right column, third line", 0.55, 0.26, 0.90, confidence=0.42),
]


def text_of(lines: list[OcrLine]) -> tuple[str, list[TextBox]]:
    """The running text `layout` makes of a page without a table, and its boxes."""
    (block,) = layout(lines)
    assert isinstance(block, TextBlock)
    return block.text, block.boxes


def test_lines_read_columns_first_then_lines_with_a_box_each() -> None:
    text, boxes = text_of(TWO_COLUMNS)
    assert text.split("\n\n") == [
        "A title across the page",
        "Left column, first line Left column, second line Left column, third line",
        "Right column, first line Right column, second line Right column, third line",
    ]
    assert [text[b.start : b.end] for b in boxes] == [
        "A title across the page",
        *(f"Left column, {n} line" for n in ("first", "second", "third")),
        *(f"Right column, {n} line" for n in ("first", "second", "third")),
    ]
    assert boxes[-1].confidence == 0.42 and (boxes[0].x0, boxes[0].y0) == (0.10, 0.05)


def test_cells_of_a_table_row_read_across_the_row() -> None:
    cells = [
        line(t, x, y, x + 0.1)
        for y, row in ((0.1, ("Item", "Price", "Stock")), (0.13, ("Kettle", "24.00", "7")))
        for x, t in zip((0.1, 0.4, 0.7), row)
    ]
    (table,) = layout(list(reversed(cells)))
    assert isinstance(table, TableBlock) and table.caption is None
    assert [[cell.text for cell in row] for row in table.rows] == [["Item", "Price", "Stock"], ["Kettle", "24.00", "7"]]


def test_chinese_lines_and_segments_join_without_a_space() -> None:
    text, boxes = text_of([line("水库的库容为", 0.1, 0.1, 0.4), line("三点二亿立方米。", 0.45, 0.1, 0.8)])
    assert text == "水库的库容为三点二亿立方米。" and len(boxes) == 2
    text, _ = text_of([line("水库的总库容为三点二亿立", 0.1, 0.1, 0.8), line("方米，灌溉农田四万亩。", 0.1, 0.13, 0.7)])
    assert text == "水库的总库容为三点二亿立方米，灌溉农田四万亩。"
    # Chinese wraps anywhere: a number or a Latin word cut at the end of a line joins without a space.
    text, _ = text_of(
        [
            line("准决赛阶段16", 0.1, 0.1, 0.8),
            line("名运动员，zh-cn:博尔特;zh", 0.1, 0.13, 0.7),
            line("-tw:柏特", 0.1, 0.16, 0.3),
        ]
    )
    assert text == "准决赛阶段16名运动员，zh-cn:博尔特;zh-tw:柏特"
    assert (
        text_of([line("Room 16", 0.1, 0.1, 0.8), line("is on the left.", 0.1, 0.13, 0.7)])[0]
        == "Room 16 is on the left."
    )


def test_english_lines_with_a_chinese_gloss_keep_the_space_between_their_words() -> None:
    text, _ = text_of(
        [
            line("The city of Tokyo (東京), home", 0.1, 0.1, 0.8),
            line("to 14 million people (一千四百万).", 0.1, 0.13, 0.7),
        ]
    )
    assert text == "The city of Tokyo (東京), home to 14 million people (一千四百万)."


def cells(y: float, *row: tuple[str, float, float], confidence: float = 0.99) -> list[OcrLine]:
    return [line(text, x0, y, x1, confidence) for text, x0, x1 in row]


PRICES_PAGE_1 = [
    line("Stock of the depot, as counted in March.", 0.1, 0.05, 0.8),
    line("Table 3: Prices", 0.1, 0.10, 0.3),
    *cells(0.13, ("Item", 0.1, 0.16), ("Price", 0.4, 0.47), ("Stock", 0.7, 0.77)),
    *cells(0.16, ("Kettle K7", 0.1, 0.22), ("24.00", 0.4, 0.46), ("7", 0.7, 0.72)),
    # OCR read one cell as two boxes, and the next cell goes on on a line of its own.
    *cells(0.19, ("Copper", 0.1, 0.15), ("kettle", 0.155, 0.2), ("31.50", 0.4, 0.46), ("2", 0.7, 0.72)),
    line("(blue)", 0.1, 0.22, 0.16),
    *cells(0.25, ("Teapot T2", 0.1, 0.21), ("12.00", 0.4, 0.46), ("11", 0.7, 0.73), confidence=0.6),
    line("Counted by hand; prices without VAT.", 0.1, 0.32, 0.8),
]
PRICES_PAGE_2 = [
    *cells(0.05, ("Lamp L1", 0.1, 0.2), ("8.00", 0.4, 0.45), ("30", 0.7, 0.73)),
    line("End of the list.", 0.1, 0.12, 0.35),
]
PRICES_HEADER = "| Item | Price | Stock |\n| --- | --- | --- |"


def test_a_scanned_table_becomes_markdown_rows_under_its_caption_and_header() -> None:
    ocr = StandInOcr([], pages=[PRICES_PAGE_1, PRICES_PAGE_2])
    doc = parse(DocKind.PDF, hostile.mixed_scan_pdf([None, None]), "prices.pdf", ocr=ocr)
    assert [(s.page, s.text) for s in doc.sections if not s.table_header] == [
        (1, "Stock of the depot, as counted in March."),
        (1, "Counted by hand; prices without VAT."),
        (2, "End of the list."),
    ]
    first, second = (s for s in doc.sections if s.table_header)
    assert first.table_header == f"Table 3: Prices\n{PRICES_HEADER}"
    assert first.text == (
        f"Table 3: Prices\n{PRICES_HEADER}\n| Kettle K7 | 24.00 | 7 |\n| Copper kettle | 31.50 | 2 |\n"
        "| (blue) |  |  |\n| Teapot T2 | 12.00 | 11 |"
    )
    # Each OCR line keeps its box and score, on the text of its cell.
    assert [(doc.text[b.start : b.end], b.confidence) for b in first.boxes][:3] == [
        ("Table 3: Prices", 0.99),
        ("Item", 0.99),
        ("Price", 0.99),
    ]
    assert [doc.text[b.start : b.end] for b in first.boxes if b.x0 == 0.155] == ["Copper kettle"]
    assert ocr_flags(doc, {"page": 1, "start": first.start, "end": first.end}, 0.8) == {
        "ocr_lines": 15,
        "ocr_low_confidence": 3,
    }
    # The table goes on on the next page with no header row of its own (one row): it takes the first's.
    assert (second.page, second.table_header) == (2, f"Table 3: Prices (continued)\n{PRICES_HEADER}")
    assert second.text.endswith(f"{PRICES_HEADER}\n| Lamp L1 | 8.00 | 30 |")
    assert [doc.text[b.start : b.end] for b in second.boxes] == ["Lamp L1", "8.00", "30"]

    chunks = chunk_document(doc, "d", Chunker(lambda t: len(t.split()), chunk_tokens=40, chunk_overlap=4))
    rows = [c for c in chunks if "| Teapot" in c.text or "| Lamp" in c.text]
    assert len(rows) == 2 and all(PRICES_HEADER in c.text for c in rows), "every chunk of rows names the columns"


def test_a_new_table_after_a_page_without_one_does_not_take_the_earlier_header() -> None:
    page_3 = [
        *cells(0.05, ("Town", 0.1, 0.18), ("Visitors", 0.4, 0.5), ("Year", 0.7, 0.75)),
        *cells(0.08, ("Leeds", 0.1, 0.17), ("1,200", 0.4, 0.46), ("2024", 0.7, 0.75)),
    ]
    text_only = [line("The depot closed for the summer.", 0.1, 0.05, 0.8)]
    ocr = StandInOcr([], pages=[PRICES_PAGE_1, text_only, page_3])
    doc = parse(DocKind.PDF, hostile.mixed_scan_pdf([None, None, None]), "prices.pdf", ocr=ocr)
    last = [s for s in doc.sections if s.table_header][-1]
    assert last.page == 3
    assert last.table_header == "| Town | Visitors | Year |\n| --- | --- | --- |"
    assert last.text == f"{last.table_header}\n| Leeds | 1,200 | 2024 |"


def test_running_text_that_ocr_cut_in_two_is_not_a_table() -> None:
    ocr = StandInOcr(
        [
            *cells(0.10, ("The lease of the mill", 0.1, 0.5), ("runs until the spring of 2031", 0.52, 0.9)),
            *cells(0.13, ("and is paid", 0.1, 0.3), ("in four parts, each due on the first of a quarter.", 0.32, 0.9)),
        ]
    )
    doc = parse(DocKind.PDF, hostile.mixed_scan_pdf([None]), "lease.pdf", ocr=ocr)
    assert not any(s.table_header for s in doc.sections)
    assert "The lease of the mill runs until the spring of 2031" in doc.text


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "TIFF", "WEBP", "BMP"])
def test_images_are_recognised_from_their_bytes(fmt: str) -> None:
    page = scans.render_page(["A line of text."], dpi=50)
    assert detect(scans.image_bytes(page, fmt), "upload.bin") is DocKind.IMAGE


def test_other_images_and_text_starting_with_bm_are_not_read_as_images() -> None:
    gif = scans.image_bytes(scans.render_page(["A line."], dpi=50), "GIF")
    with pytest.raises(UnsupportedFileType, match="GIF image"):
        detect(gif, "a.gif")
    assert detect(b"BMW and Audi sold more cars in spring than in any year before.", "notes.txt") is DocKind.TEXT


def test_an_image_decompression_bomb_is_refused_from_its_header() -> None:
    ocr = StandInOcr([])
    bomb = hostile.png_bomb(60_000)
    assert len(bomb) < 4096
    with pytest.raises(DocumentRejected, match=r"60,000 x 60,000 pixels.*at most 64 MP per page") as info:
        parse(DocKind.IMAGE, bomb, "bomb.png", ocr=ocr)
    assert info.value.detail["limit"] == 64_000_000 and ocr.calls == 0


def test_a_tiff_of_ten_thousand_pages_is_refused_before_the_first_is_decoded() -> None:
    ocr = StandInOcr([line("never read", 0.1, 0.1, 0.5)])
    with pytest.raises(DocumentRejected, match=r"more than 200 pages.*RAG_MAX_OCR_PAGES"):
        parse(DocKind.IMAGE, hostile.tiff_of_pages(10_000), "fax.tiff", ocr=ocr, max_ocr_pages=200)
    assert ocr.calls == 0


def test_a_multi_page_tiff_gives_a_section_per_page_with_its_boxes() -> None:
    ocr = StandInOcr([line("Invoice 2291, due in March", 0.1, 0.1, 0.6)])
    doc = parse(DocKind.IMAGE, _tiff([_inked()] * 3), "fax.tiff", ocr=ocr)
    assert doc.kind is DocKind.IMAGE and doc.pages == 3 and ocr.calls == 3
    assert [s.page for s in doc.sections] == [1, 2, 3]
    for section in doc.sections:
        (box,) = section.boxes
        assert doc.text[box.start : box.end] == "Invoice 2291, due in March" == section.text


def test_a_scanned_pdf_over_the_ocr_page_cap_is_refused_before_any_ocr() -> None:
    ocr = StandInOcr([line("never read", 0.1, 0.1, 0.5)])
    with pytest.raises(DocumentRejected, match=r"has 3 scanned pages \(of 4\).*at most 2 .*RAG_MAX_OCR_PAGES"):
        parse(
            DocKind.PDF, hostile.mixed_scan_pdf(["A text page", None, None, None]), "scan.pdf", ocr=ocr, max_ocr_pages=2
        )
    assert ocr.calls == 0


def test_a_mixed_pdf_keeps_its_text_pages_and_reads_its_scanned_pages() -> None:
    ocr = StandInOcr(
        [line("Scanned: the lease ends in 2031", 0.1, 0.1, 0.7), line("smudged", 0.1, 0.2, 0.3, confidence=0.5)]
    )
    pdf = hostile.mixed_scan_pdf(["Typed: the rent is 900 a month", None], running_head="Page 2")
    doc = parse(DocKind.PDF, pdf, "lease.pdf", ocr=ocr, min_confidence=0.8)
    assert ocr.calls == 1, "only the scanned page is read by OCR, its page number notwithstanding"
    typed, scanned = doc.sections
    assert (typed.page, typed.text) == (1, "Typed: the rent is 900 a month")
    # Text-layer lines have their boxes too, from PDFium, with no OCR score.
    assert [(doc.text[b.start : b.end], b.confidence) for b in typed.boxes] == [
        ("Typed: the rent is 900 a month", None)
    ]
    assert scanned.page == 2 and scanned.text == "Scanned: the lease ends in 2031\n\nsmudged"
    assert [doc.text[b.start : b.end] for b in scanned.boxes] == ["Scanned: the lease ends in 2031", "smudged"]
    assert doc.warnings == ("page 2: 1 of 2 OCR lines read with confidence under 0.8",)
    assert ocr_flags(doc, {"page": 2, "start": scanned.start, "end": scanned.end}, 0.8) == {
        "ocr_lines": 2,
        "ocr_low_confidence": 1,
    }
    assert ocr_flags(doc, {"page": 1, "start": typed.start, "end": typed.end}, 0.8) == {}, (
        "text-layer chunks carry no flags"
    )


def test_a_page_whose_ocr_is_skipped_is_left_out_with_a_warning() -> None:
    ocr = StandInOcr([line("The second page survives", 0.1, 0.1, 0.7)], skip=(1,))
    doc = parse(DocKind.PDF, hostile.mixed_scan_pdf([None, None]), "scan.pdf", ocr=ocr)
    assert [s.page for s in doc.sections] == [2] and doc.text == "The second page survives"
    assert doc.warnings == ("page 1 was left out: OCR did not finish within 1 s (RAG_OCR_PAGE_TIMEOUT_S)",)


def test_an_ocr_page_over_its_time_costs_its_worker_not_the_pool() -> None:
    pool = OcrPool(memory_mb=2048, workers=1, page_timeout_s=0.2)
    try:
        page = scans.scanned(scans.render_page(["Whatever this page says is never read."] * 20), seed=1)

        assert pool.read(np.asarray(page), "slow.pdf") == PageLeftOut(
            "OCR did not finish within 0.2 s (RAG_OCR_PAGE_TIMEOUT_S)"
        )
        pool.page_timeout_s = 60
        answer = pool.read(np.asarray(scans.render_page(["The kettle is on the table."])), "small.png")
        assert isinstance(answer, PageLines) and [x.text for x in answer.lines] == ["The kettle is on the table."]
    finally:
        pool.close()


def test_an_ocr_worker_that_cannot_start_names_the_ocr_memory_setting() -> None:
    pool = OcrPool(memory_mb=64, workers=1, page_timeout_s=5)
    try:
        with pytest.raises(RagError, match=r"OCR process did not start within its 64 MB .*\(RAG_OCR_MEMORY_MB too low"):
            pool.read(np.asarray(scans.render_page(["Never read."])), "scan.pdf")
    finally:
        pool.close()


def report_page(number: int, body: list[OcrLine]) -> list[OcrLine]:
    """A page as OCR reads a printed report: a running header, the body, the page number centred below."""
    return [line("Annual Report 2024 - Northwind Traders", 0.1, 0.03, 0.6), *body, line(str(number), 0.49, 0.95, 0.51)]


def test_page_numbers_and_running_headers_are_not_text() -> None:
    bodies = [
        [line("Revenue grew by 12 percent in the year.", 0.1, 0.1, 0.8), line("Costs fell.", 0.1, 0.13, 0.3)],
        [line("The board met four times.", 0.1, 0.1, 0.7)],
        [line("Dividends of 3 cents were paid.", 0.1, 0.1, 0.7)],
    ]
    ocr = StandInOcr([], pages=[report_page(n, body) for n, body in enumerate(bodies, 1)])
    doc = parse(DocKind.PDF, hostile.mixed_scan_pdf([None, None, None]), "report.pdf", ocr=ocr)
    assert [(s.page, s.text) for s in doc.sections] == [
        (1, "Revenue grew by 12 percent in the year. Costs fell."),
        (2, "The board met four times."),
        (3, "Dividends of 3 cents were paid."),
    ]
    chunks = chunk_document(doc, "d", Chunker(lambda text: len(text.split()), chunk_tokens=50, chunk_overlap=0))
    assert not any(c.text.strip().isdigit() or "Annual Report" in c.text for c in chunks)


@pytest.mark.parametrize("number", ["1", "- 2 -", "Page 3", "Page 4 of 9", "第 5 页", "iv"])
def test_a_lone_page_number_in_the_margin_is_not_text(number: str) -> None:
    lines = [line("The kettle is on the table.", 0.1, 0.1, 0.7), line(number, 0.45, 0.95, 0.55)]
    doc = parse(DocKind.IMAGE, _tiff([_inked()]), "note.tiff", ocr=StandInOcr(lines))
    assert doc.text == "The kettle is on the table."


def test_lines_near_the_edges_that_belong_to_the_body_stay() -> None:
    """A table's header row at the top of each page, a short last line, a number inside the body stay."""
    header = cells(0.09, ("Port", 0.1, 0.3), ("Service", 0.5, 0.8))
    pages = [
        [*header, *cells(0.115, ("22", 0.1, 0.2), ("ssh", 0.5, 0.6)), line("7", 0.1, 0.15, 0.12)],
        [
            *header,
            *cells(0.115, ("993", 0.1, 0.2), ("imaps", 0.5, 0.6)),
            line("Ends here", 0.1, 0.9, 0.3),
            line("Total: 2", 0.1, 0.925, 0.3),
        ],
    ]
    doc = parse(DocKind.PDF, hostile.mixed_scan_pdf([None, None]), "ports.pdf", ocr=StandInOcr([], pages=pages))
    for kept in ("| Port | Service |", "| 22 | ssh |", "| 993 | imaps |", "7", "Ends here", "Total: 2"):
        assert kept in doc.text


def test_a_rendered_scan_keeps_its_page_numbers_and_running_header_out_of_the_text() -> None:
    paragraphs = [
        ["Northwind's revenue grew by twelve percent, led by its tea business."],
        ["The board approved a dividend of three cents a share."],
    ]
    header = "Northwind Traders - Annual Report 2024"
    pages = [
        scans.scanned(scans.furnished(scans.render_page(text), header, str(n)), seed=n)
        for n, text in enumerate(paragraphs, 1)
    ]
    pool = OcrPool(memory_mb=2048, workers=1, page_timeout_s=120)

    try:
        doc = parse(DocKind.PDF, scans.image_pdf(pages), "report.pdf", ocr=pool.reader("report.pdf"))
    finally:
        pool.close()
    assert [s.page for s in doc.sections] == [1, 2]
    assert "twelve percent" in doc.text and "three cents" in doc.text
    assert "Annual Report" not in doc.text, doc.text
    assert not any(s.text.strip().isdigit() for s in doc.sections)
    assert not any(line.strip().isdigit() for line in doc.text.splitlines())


def _inked() -> np.ndarray:
    """A white page of 200 x 40 pixels with a bar of ink where a line of text would be."""
    page = np.full((40, 200), 255, dtype=np.uint8)
    page[15:25, 10:190] = 0
    return page


def _tiff(pages: list[np.ndarray]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    frames = [Image.fromarray(p) for p in pages]
    frames[0].save(out, format="TIFF", save_all=True, append_images=frames[1:])
    return out.getvalue()


@pytest.mark.parametrize(
    ("what", "page"),
    [("1 x 1 pixel", np.zeros((1, 1), dtype=np.uint8)), ("blank", np.full((600, 400), 255, dtype=np.uint8))],
)
def test_pages_that_cannot_hold_text_cost_no_ocr(what: str, page: np.ndarray) -> None:
    """OCR's cost follows the pixels that could hold text, not the pages: 180 pages of nothing are not sent."""
    from ingest.loaders.image import load_image

    calls: list[tuple[int, ...]] = []

    def ocr(image: np.ndarray) -> PageRead:
        calls.append(image.shape)
        return PageLines([])

    with pytest.raises(DocumentRejected, match="no text that OCR could read on its 180 page"):
        load_image(_tiff([page] * 180), "nothing.tif", ocr)
    assert calls == [], f"{len(calls)} {what} pages sent to OCR"
    load_image(
        _tiff([page, _inked()]),
        "one.tif",
        lambda image: calls.append(image.shape) or PageLines([line("ink", 10, 15, 190)]),
    )
    assert calls == [(40, 200)]
