"""OCR: reading order of OCR lines, image types from the bytes, bombs and page caps refused before any
decoding or OCR, scanned pages of mixed PDFs, and a page over its time left out with a warning.

The loaders are driven here with a stand-in OCR function (the engine's lines are the input of what is
tested); the one real OCR worker started here is the one whose page runs past its time. The real
engine reads real scans in tests/test_ocr_api.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from ingest.detect import detect
from ingest.loaders import parse
from ingest.loaders.ocr import OcrLine, PageSkipped, layout, ocr_flags
from ingest.models import DocKind
from ingest.ocr_pool import OcrPool
from rag.core.errors import DocumentRejected, UnsupportedFileType
from tests import hostile, scans


class StandInOcr:
    """Answers every page with the same lines (or raises PageSkipped on the pages listed); counts calls."""

    def __init__(self, lines: list[OcrLine], skip: tuple[int, ...] = ()) -> None:
        self.lines = lines
        self.skip = skip
        self.calls = 0

    def __call__(self, image: object) -> list[OcrLine]:
        self.calls += 1
        if self.calls in self.skip:
            raise PageSkipped("OCR did not finish within 1 s (RAG_OCR_PAGE_TIMEOUT_S)")
        return self.lines


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


def test_lines_read_columns_first_then_lines_with_a_box_each() -> None:
    text, boxes = layout(TWO_COLUMNS)
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
    text, _ = layout(list(reversed(cells)))
    assert text == "Item Price Stock\nKettle 24.00 7"


def test_chinese_lines_and_segments_join_without_a_space() -> None:
    text, boxes = layout([line("水库的库容为", 0.1, 0.1, 0.4), line("三点二亿立方米。", 0.45, 0.1, 0.8)])
    assert text == "水库的库容为三点二亿立方米。" and len(boxes) == 2
    text, _ = layout([line("水库的总库容为三点二亿立", 0.1, 0.1, 0.8), line("方米，灌溉农田四万亩。", 0.1, 0.13, 0.7)])
    assert text == "水库的总库容为三点二亿立方米，灌溉农田四万亩。"


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
    doc = parse(DocKind.IMAGE, hostile.tiff_of_pages(3), "fax.tiff", ocr=ocr)
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

        status, why = pool.reader("slow.pdf")(np.asarray(page))
        assert (status, why) == ("skip", "OCR did not finish within 0.2 s (RAG_OCR_PAGE_TIMEOUT_S)")
        pool.page_timeout_s = 60
        status, lines = pool.reader("small.png")(np.asarray(scans.render_page(["The kettle is on the table."])))
        assert status == "lines" and [x.text for x in lines] == ["The kettle is on the table."]
    finally:
        pool.close()
