"""A scanned page reads the same whether it comes as an image or inside an image-only PDF: the real OCR
engine reads one English page of paragraphs and one Chinese page of option lines, each scanned at 150 dpi
as bench/real_docs/make_corpus.py scans its documents, once as a PNG (read at its own pixels) and once as a
PDF (rendered at RAG_OCR_DPI, 200, so scaled up), and both give the page's facts and the same words."""

from __future__ import annotations

import difflib

import pytest

from ingest.loaders import parse
from ingest.loaders.ocr import PageLines, make_engine, recognize
from ingest.models import DocKind
from tests import scans

ENGLISH = [
    "1. symlinked directory completion behavior",
    "Starting with readline-4.2a, completion on symlinks that point to directories does not append the slash. "
    "To restore the behaviour found in readline-4.2, add to /etc/inputrc or ~/.inputrc:",
    "set mark-symlinked-directories on",
    "5. What is /etc/bash.bashrc? It doesn't seem to be documented.",
]
CHINESE = [
    "-a, --archive",
    "与 -dR --preserve=all 相同。",
    "--link",
    "使用硬链接取代复制",
    "--one-file-system",
    "停留在当前文件系统中",
]
FACTS = {
    "english": ["mark-symlinked-directories", "/etc/bash.bashrc", "readline-4.2a"],
    "chinese": [
        "--archive",
        "--preserve=all",
        "--link",
        "使用硬链接取代复制",
        "--one-file-system",
        "停留在当前文件系统中",
    ],
}


@pytest.fixture(scope="module")
def engine() -> object:
    return make_engine(threads=1)


@pytest.mark.parametrize("page", ["english", "chinese"])
def test_a_scanned_page_reads_the_same_as_an_image_and_as_an_image_only_pdf(engine: object, page: str) -> None:
    paragraphs = ENGLISH if page == "english" else CHINESE
    scan = scans.scanned(scans.render_page(paragraphs, dpi=150, point_size=10 if page == "english" else 9), seed=7)

    def ocr(image: object) -> PageLines:
        return PageLines(recognize(engine, image))

    as_image = parse(DocKind.IMAGE, scans.image_bytes(scan, "PNG"), "page.png", ocr=ocr)
    as_pdf = parse(DocKind.PDF, scans.image_pdf([scan], dpi=150), "page.pdf", ocr=ocr)
    texts = [doc.sections[0].text for doc in (as_image, as_pdf)]
    assert [doc.pages for doc in (as_image, as_pdf)] == [1, 1]
    for text in texts:
        missing = [fact for fact in FACTS[page] if fact not in text]
        assert not missing, (missing, text)
    same = difflib.SequenceMatcher(None, *texts, autojunk=False).ratio()
    assert same > 0.95, texts
