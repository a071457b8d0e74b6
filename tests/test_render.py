"""Pages rendered for citations: bounded in size whatever the page says, boxes drawn, in the worker."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from ingest.loaders.render import MAX_ASPECT, render_page
from ingest.sandbox import ParserPool
from rag.core.errors import DocumentRejected
from tests import hostile


def image(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


def test_a_tall_thin_page_is_bounded_by_the_aspect_cap() -> None:
    data = hostile.text_pdf(["x"]).replace(b"/MediaBox [0 0 612 792]", b"/MediaBox [0 0 9 14400]")
    page = image(render_page(data, 1, 800))
    assert page.height <= 800 * MAX_ASPECT and page.width <= 800


def test_boxes_are_drawn_and_pages_checked() -> None:
    data = hostile.text_pdf(["Owls"])
    plain = image(render_page(data, 1, 400))
    marked = image(render_page(data, 1, 400, boxes=[[0.25, 0.25, 0.75, 0.5]]))
    assert plain.getpixel((200, 150)) == (255, 255, 255)
    r, g, b = marked.getpixel((200, 150))
    assert r > 240 and g > 200 and b < 200
    with pytest.raises(DocumentRejected, match="no page 2"):
        render_page(data, 2, 400)


def test_an_image_original_renders_its_frame() -> None:
    frames = [Image.new("RGB", (1200, 600), c) for c in ("red", "blue")]
    out = io.BytesIO()
    frames[0].save(out, format="TIFF", save_all=True, append_images=frames[1:])
    second = image(render_page(out.getvalue(), 2, 300))
    assert second.size == (300, 150) and second.getpixel((10, 10)) == (0, 0, 255)


def test_rendering_runs_in_the_bounded_worker() -> None:
    pool = ParserPool(memory_mb=1024, max_workers=1)
    try:
        png = pool.render(hostile.text_pdf(["In the worker"]), "w.pdf", timeout_s=30, page=1, width=300, boxes=[])
        assert image(png).width == 300
        with pytest.raises(DocumentRejected, match="no page 5"):
            pool.render(hostile.text_pdf(["x"]), "w.pdf", timeout_s=30, page=5, width=300, boxes=[])
    finally:
        pool.close()
