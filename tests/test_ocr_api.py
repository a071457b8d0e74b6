"""Scans and photos through the real API: a scanned PDF (an English page, a Chinese page), a phone photo
of a page and a scanned price list are uploaded, read by the real OCR worker, and a question about each
is answered from the right file and page by the real llama-server, embedding server and Chroma; the
price list's rows come with its header."""

from __future__ import annotations

import httpx
import pytest

from rag.core.config import Settings
from tests import scans
from tests.chat_helpers import ask, serve, upload
from tests.table_docs import table_pdf

pytestmark = pytest.mark.integration

ENGLISH = (
    "The Harbour Bridge of Velmora was opened in 1932 by Mayor Ilse Varnhagen. It carries six lanes of traffic "
    "and two railway tracks across the Sund estuary, and its main span is 503 metres long."
)
CHINESE = "青岚湖水库位于云岭县北部，于1958年建成。水库的总库容为三点二亿立方米，灌溉农田四万亩。"
PHOTO = (
    "The Model K7 kettle comes with a warranty of 26 months. Descale it every four weeks with citric acid; "
    "never use vinegar, which damages the heating plate."
)
PRICES = [
    ["Brass lantern L4", "38.00 EUR", "12"],
    ["Copper kettle K9", "54.50 EUR", "3"],
    ["Enamel teapot T2", "21.90 EUR", "40"],
    ["Iron skillet S6", "47.20 EUR", "9"],
    ["Linen apron A1", "15.00 EUR", "65"],
]


def test_scans_a_photo_and_a_scanned_price_list_answer_questions_with_their_source(backend_settings: Settings) -> None:
    pdf = scans.image_pdf(
        [scans.scanned(scans.render_page([ENGLISH]), seed=1), scans.scanned(scans.render_page([CHINESE]), seed=2)]
    )
    photo = scans.image_bytes(scans.photographed(scans.render_page([PHOTO]), seed=3), "PNG")
    prices = scans.scan_of_pdf(table_pdf("Price list, spring", ["Item", "Price", "Stock"], PRICES), seed=4)
    with serve(backend_settings) as url:
        upload(url)  # other documents, for the scans to be found among
        files = [
            ("files", ("velmora-scan.pdf", pdf, "application/pdf")),
            ("files", ("kettle-photo.png", photo, "image/png")),
            ("files", ("prices-scan.pdf", prices, "application/pdf")),
        ]
        response = httpx.post(f"{url}/v1/documents", files=files, timeout=600)
        assert response.status_code == 200, response.text
        results = {r["filename"]: r for r in response.json()["results"]}
        assert {name: r["status"] for name, r in results.items()} == {
            "velmora-scan.pdf": "indexed",
            "kettle-photo.png": "indexed",
            "prices-scan.pdf": "indexed",
        }
        assert all(isinstance(r["warnings"], list) for r in results.values())

        for question, source, page, fact in [
            ("Who opened the Harbour Bridge of Velmora?", "velmora-scan.pdf", 1, "Mayor Ilse Varnhagen"),
            ("青岚湖水库的总库容是多少？", "velmora-scan.pdf", 2, "总库容为三点二亿立方米"),
            ("How long is the warranty of the Model K7 kettle?", "kettle-photo.png", 1, "warranty of 26 months"),
            ("What is the price of the Copper kettle K9?", "prices-scan.pdf", 1, "| Copper kettle K9 | 54.50 EUR |"),
        ]:
            answer = httpx.post(f"{url}/v1/chat", json=ask(question, stream=False), timeout=300)
            assert answer.status_code == 200, answer.text
            top = answer.json()["sources"][0]
            assert (top["source"], top.get("page")) == (source, page), (question, top)
            assert fact in top["text"], "the OCR read the fact the answer needs"
            assert top["ocr_low_confidence"] == 0, "a chunk of OCR text says how many of its lines are in doubt"
            if source == "prices-scan.pdf":
                assert "| Item | Price | Stock |" in top["text"], "a scanned table's rows come under its header"
            # The cited page opens as an image with the passage's OCR boxes drawn on it.
            index = top["chunk_id"].rsplit(":", 1)[1]
            image = httpx.get(f"{url}/v1/documents/{top['doc_id']}/pages/{page}", params={"chunk": index}, timeout=120)
            assert image.status_code == 200 and image.headers["content-type"] == "image/png", image.text
            chunk = httpx.get(f"{url}/v1/documents/{top['doc_id']}/chunks/{index}", timeout=60).json()
            assert chunk["page_image"] and chunk["boxes"] and len(chunk["boxes"][0]) == 5  # x0, y0, x1, y1, OCR score
