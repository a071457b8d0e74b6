"""A page of a stored original as a PNG, for showing a cited passage where it stands.

    png = render_page(data, page=3, width=1000, boxes=[[x0, y0, x1, y1], ...])

PDFs are rendered with PDFium, images (their frame `page`, for multi-page TIFFs) with Pillow; `boxes`
(fractions of the page, top-left origin, as `ingest.models.encode_boxes` keeps them) are drawn as
translucent highlights. The image is `width` pixels wide at most and never taller than `MAX_ASPECT`
times that, so a hostile page size cannot ask for a huge bitmap. Runs in the bounded worker of
`ingest.sandbox` like the parsers: never in the API process.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from rag.core.errors import DocumentRejected

MAX_ASPECT = 4
_FILL = (255, 213, 0, 90)
_EDGE = (230, 120, 0, 255)


def render_page(data: bytes, page: int, width: int, boxes: Sequence[Sequence[float]] = ()) -> bytes:
    """Page `page` (1-based) of the PDF or image in `data` as PNG bytes, with `boxes` highlighted."""
    image = (
        _pdf_page(data, page, width)
        if data[:5] == b"%PDF-" or b"%PDF-" in data[:1024]
        else _image_page(data, page, width)
    )
    if boxes:
        image = _highlight(image, boxes)
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=6)
    return out.getvalue()


def _pdf_page(data: bytes, page: int, width: int) -> Any:  # a PIL image
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(data)
    try:
        if not 1 <= page <= len(pdf):
            raise DocumentRejected(f"no page {page}: the document has {len(pdf)}")
        pdf_page = pdf[page - 1]
        try:
            w, h = pdf_page.get_size()
            if w <= 0 or h <= 0:
                raise DocumentRejected(f"page {page} has no area")
            scale = min(width / w, width * MAX_ASPECT / h)
            bitmap = pdf_page.render(scale=scale, may_draw_forms=True)
            return bitmap.to_pil().convert("RGB")
        finally:
            pdf_page.close()
    finally:
        pdf.close()


def _image_page(data: bytes, page: int, width: int) -> Any:  # a PIL image
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as image:
        frames = getattr(image, "n_frames", 1)
        if not 1 <= page <= frames:
            raise DocumentRejected(f"no page {page}: the image has {frames}")
        image.seek(page - 1)
        image.draft("RGB", (width, width * MAX_ASPECT))  # JPEG: decode at a reduced size when it can
        frame = ImageOps.exif_transpose(image.convert("RGB"))
    frame.thumbnail((width, width * MAX_ASPECT))
    return frame


def _highlight(image: Any, boxes: Sequence[Sequence[float]]) -> Any:
    from PIL import Image, ImageDraw

    overlay = Image.new("RGBA", image.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    w, h = image.size
    for box in boxes:
        x0, y0, x1, y1 = (float(v) for v in box[:4])
        rect = (x0 * w - 2, y0 * h - 2, x1 * w + 2, y1 * h + 2)
        draw.rectangle(rect, fill=_FILL, outline=_EDGE, width=2)
    return Image.alpha_composite(image.convert("RGBA"), overlay).convert("RGB")
