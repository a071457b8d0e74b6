"""Citations that open their page: a PDF's page as an image with a chunk's passage highlighted, and a
chunk in its section, against the real API (uvicorn, the embedding server, Chroma, the parser worker)."""

# ruff: noqa: F811  (the tests take the imported api fixture as a parameter)
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image
from pydantic import SecretStr

from rag.core.config import Settings
from tests import hostile
from tests.table_docs import table_pdf
from tests.test_documents_api import LiveApi, api, serve  # noqa: F401  (api: the fixture the tests name)

pytestmark = pytest.mark.integration

ROWS = [[f"Widget {i}", f"{i * 1.5:.2f}", str(i * 3)] for i in range(70)]


def upload_one(api: LiveApi, name: str, data: bytes) -> str:
    response = api.upload((name, data))
    assert response.status_code == 200, response.text
    return response.json()["results"][0]["document_id"]


def chunks_of(api: LiveApi, doc_id: str) -> list[dict]:
    got = api.services.store.collection("default").get(where={"doc_id": doc_id})
    return sorted(
        ({"text": t, **m} for t, m in zip(got["documents"], got["metadatas"])), key=lambda c: c["chunk_index"]
    )


def png(response) -> Image.Image:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    return Image.open(io.BytesIO(response.content)).convert("RGB")


def test_a_cited_pdf_page_opens_with_the_passage_highlighted(api: LiveApi) -> None:
    doc_id = upload_one(
        api, "stock.pdf", table_pdf("Table 1: Stock", ["Item", "Price", "Stock"], ROWS, outro="The end.")
    )
    chunks = chunks_of(api, doc_id)
    on_two = next(c for c in chunks if c.get("page") == 2 and "Widget" in c["text"])
    assert on_two["text"].startswith("Table 1: Stock (continued)\n| Item | Price | Stock |")

    plain = png(api.client.get(f"/v1/documents/{doc_id}/pages/2"))
    assert plain.width == 1000 and abs(plain.height - 1000 * 792 / 612) <= 1
    marked = png(
        api.client.get(f"/v1/documents/{doc_id}/pages/2", params={"chunk": on_two["chunk_index"], "width": 600})
    )
    assert marked.width == 600
    # The highlight is yellow over the chunk's first row, where the plain page is white.
    x0, y0, x1, y1 = [round(v * s) for v, s in zip(json.loads(on_two["boxes"])[1], (600, marked.height) * 2)]
    r, g, b = marked.getpixel(((x0 + x1) // 2 + 30, (y0 + y1) // 2 - 3))
    assert r > 200 and g > 180 and b < 200, (r, g, b)
    cached = sorted(p.name for p in (api.settings.data_dir / "originals" / "default" / doc_id / "pages").iterdir())
    assert cached == ["p2-w1000.png", f"p2-w600-c{on_two['chunk_index']}.png"]

    # The chunk's own route: its page, boxes and the text around it in its section.
    got = api.client.get(f"/v1/documents/{doc_id}/chunks/{on_two['chunk_index']}").json()
    assert got["page"] == 2 and got["page_image"] is True and len(got["boxes"]) >= 2
    assert got["text"] == on_two["text"] and got["after"].startswith("| Widget")

    assert api.client.delete(f"/v1/documents/{doc_id}").status_code == 204
    assert not (api.settings.data_dir / "originals" / "default" / doc_id).exists()
    assert api.client.get(f"/v1/documents/{doc_id}/pages/1").status_code == 404


def test_page_requests_out_of_bounds_are_refused(api: LiveApi) -> None:
    doc_id = upload_one(api, "two.pdf", hostile.text_pdf(["Page one about owls.", "Page two about larks."]))
    text_id = upload_one(api, "notes.txt", "\n\n".join(f"Paragraph {i} about herons." for i in range(300)).encode())
    base = f"/v1/documents/{doc_id}"
    assert api.client.get(f"{base}/pages/3").status_code == 404
    assert "has 2 pages" in api.client.get(f"{base}/pages/3").json()["error"]["message"]
    assert api.client.get(f"{base}/pages/0").status_code in (400, 422)
    too_wide = api.client.get(f"{base}/pages/1", params={"width": 100_000})
    assert too_wide.status_code == 400 and "RAG_PAGE_IMAGE_MAX_WIDTH" in too_wide.json()["error"]["message"]
    assert api.client.get(f"{base}/pages/1", params={"width": 10}).status_code in (400, 422)
    assert api.client.get(f"{base}/pages/2", params={"chunk": 0}).status_code == 400  # chunk 0 is on page 1
    assert api.client.get(f"{base}/pages/1", params={"chunk": 99}).status_code == 404
    assert api.client.get(f"/v1/documents/{'0' * 64}/pages/1").status_code == 404
    assert api.client.get("/v1/documents/..%2F..%2Fetc/pages/1").status_code in (404, 422)
    assert api.client.get(f"/v1/documents/{text_id}/pages/1").status_code == 404  # a text file has no pages
    assert api.client.get(f"{base}/pages/1", params={"collection": "elsewhere"}).status_code == 404

    # A text file's chunk comes with its section around it.
    middle = api.client.get(f"/v1/documents/{text_id}/chunks/3").json()
    assert middle["page"] is None and middle["page_image"] is False and middle["boxes"] == []
    assert middle["before"].endswith(("herons.", "herons")) and middle["after"].startswith("Paragraph")
    assert api.client.get(f"/v1/documents/{text_id}/chunks/100000").status_code == 404


def test_the_page_routes_need_the_key(ingest_settings: Settings, tmp_path: Path) -> None:
    import httpx

    settings = ingest_settings.model_copy(update={"api_key": SecretStr("s3cret")})
    server, thread, url, _ = serve(settings)
    key = {"Authorization": "Bearer s3cret"}
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            sent = client.post(
                "/v1/documents", files={"files": ("a.pdf", hostile.text_pdf(["Owls at night."]))}, headers=key
            )
            doc_id = sent.json()["results"][0]["document_id"]
            assert client.get(f"/v1/documents/{doc_id}/pages/1").status_code == 401
            assert client.get(f"/v1/documents/{doc_id}/chunks/0").status_code == 401
            assert client.get(f"/v1/documents/{doc_id}/pages/1", headers=key).status_code == 200
            assert client.get(f"/v1/documents/{doc_id}/chunks/0", headers=key).status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)
