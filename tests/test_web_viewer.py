"""The source panel shows a cited passage in its place, in real Chromium against the real stack: a PDF's
page with the passage highlighted, and a text file's chunk inside its section."""

# ruff: noqa: F811  (the fixtures imported from test_web_page are the tests' parameters)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.table_docs import table_pdf
from tests.test_web_page import (  # noqa: F401
    api,
    ask,
    browser,
    context,
    expect,
    open_page,
    shot,
    upload,
    wait_finished,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ROWS = [[f"Widget {i}", f"{i * 1.5:.2f} EUR", f"Depot {chr(65 + i % 5)}"] for i in range(70)]
TOPICS = ["herons", "lighthouses", "glaciers", "beekeeping", "tram lines", "sourdough", "comets", "tides"]


def open_first_source(page, answer, label: str):
    answer.locator(".sources summary").click()
    answer.locator("a.source-link", has_text=label).first.click()
    panel = page.locator("#source-panel")
    expect(panel).to_be_visible()
    return panel


@pytest.mark.slow
def test_a_pdf_source_opens_its_page_with_the_passage_highlighted(context, api, tmp_path: Path) -> None:
    page, errors = open_page(context, api)
    doc = tmp_path / "stock.pdf"
    doc.write_bytes(table_pdf("Table 1: Stock by item", ["Item", "Price", "Depot"], ROWS, outro="End of the list."))
    expect(upload(page, doc)).to_have_attribute("data-status", "indexed")

    answer = ask(page, "What is the price of Widget 52?", max_tokens=16)
    wait_finished(answer)
    panel = open_first_source(page, answer, "page 2")
    image = panel.locator("#source-page-image")
    expect(panel.locator("#source-page")).to_be_visible()
    page.wait_for_function("() => (document.getElementById('source-page-image') || {}).naturalWidth === 1000")
    expect(image).to_have_attribute("alt", "Page 2 of stock.pdf, the cited passage highlighted")
    assert image.get_attribute("src").startswith("blob:")
    # The chunk is marked inside the text of its section; its table header came with it.
    expect(panel.locator("mark.cited")).to_contain_text("| Item | Price | Depot |")
    expect(panel.locator("mark.cited")).to_contain_text("Widget")
    shot(page, "source-page-highlighted")
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()
    assert panel.locator("img").count() == 0  # the page's image goes with it
    assert not errors


def test_a_text_source_shows_the_chunk_inside_its_section(context, api, tmp_path: Path) -> None:
    page, errors = open_page(context, api)
    doc = tmp_path / "almanac.txt"
    paragraphs = [
        f"Note {i} on {TOPICS[i % len(TOPICS)]}: the almanac records item {i} with care, season after season."
        for i in range(60)
    ]
    paragraphs[30] = "The Skerry lighthouse keeper rings the brass bell at dusk every evening."
    doc.write_text("\n\n".join(paragraphs))
    expect(upload(page, doc)).to_have_attribute("data-status", "indexed")

    answer = ask(page, "Who rings the brass bell at dusk?", max_tokens=16)
    wait_finished(answer)
    panel = open_first_source(page, answer, "almanac.txt")
    mark = panel.locator("#source-text mark.cited")
    expect(mark).to_contain_text("brass bell")
    whole = panel.locator("#source-text").text_content()
    assert len(whole) > len(mark.text_content()) + 100  # the section's text around the chunk is shown
    expect(panel.locator("#source-page")).to_be_hidden()  # a text file has no page to show
    shot(page, "source-in-section")
    assert not errors
