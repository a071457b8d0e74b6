"""Images (PNG, JPEG, TIFF with its pages, WebP, BMP): each page read by OCR, one section per page.

Pillow reads only the header when it opens a file, so the size and the page count are checked before
anything is decoded: a 60,000 x 60,000 PNG fits in a few KB and would decode to 3.6 GB. Beyond
`MAX_PIXELS` a page is refused naming the limit (Pillow's own bomb check is set to the same limit, in
case a format states its size late), and a file of more pages than the OCR page cap is refused before
the first page is decoded. Each page is turned upright by its EXIF orientation (phone photos), made
grayscale and scaled down to what the detector reads before it goes to the OCR.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

from PIL import Image, ImageOps, UnidentifiedImageError

from rag.core.errors import DocumentRejected

from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder
from .furniture import without_furniture
from .ocr import MAX_SIDE, OcrFn, add_read_page, announce_pages, read_page
from .tables import TableCarry

MAX_PIXELS = 64_000_000  # a page scanned at 600 dpi on A3 is 70 MP...; at 300 dpi on A4, 8.7 MP
# Pillow warns past MAX_IMAGE_PIXELS and raises past twice that; we refuse past it ourselves first.
Image.MAX_IMAGE_PIXELS = MAX_PIXELS


def load_image(
    data: bytes, name: str, ocr: OcrFn | None, max_pages: int = 200, min_confidence: float = 0.8
) -> LoadedDocument:
    """The text OCR reads on every page of the image; DocumentRejected for bombs, broken files, no text."""
    if ocr is None:
        raise DocumentRejected(f"{name} is an image, and reading images needs the OCR worker")
    image = _open(data, name)
    try:
        pages = _count_pages(image, name, max_pages)
        builder = DocumentBuilder()
        notes: list[str] = []
        tables = TableCarry()  # a table over the pages of a TIFF keeps its header
        announce_pages(ocr, pages)
        read = without_furniture({n: read_page(_page_pixels(image, n - 1, name), ocr) for n in range(1, pages + 1)})
        for number, lines in read.items():
            tables.turn_page()
            notes += add_read_page(builder, number, lines, min_confidence, tables)
    finally:
        image.close()
    try:
        return builder.build(name, DocKind.IMAGE, pages=pages, warnings=tuple(notes))
    except DocumentRejected:
        raise DocumentRejected(f"{name} has no text that OCR could read on its {pages} page(s)") from None


def _open(data: bytes, name: str) -> Image.Image:
    image: Image.Image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # _check_size refuses it, by name
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        image = _open_unchecked(data)  # only to state its size: nothing is decoded
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DocumentRejected(f"{name} is not a readable image ({exc})") from None
    _check_size(image, name, 1)
    return image


def _open_unchecked(data: bytes) -> Image.Image:
    """The header of an image Pillow's own bomb check refused (over twice MAX_PIXELS)."""
    Image.MAX_IMAGE_PIXELS = None
    try:
        return Image.open(io.BytesIO(data))
    finally:
        Image.MAX_IMAGE_PIXELS = MAX_PIXELS


def _count_pages(image: Image.Image, name: str, max_pages: int) -> int:
    """How many pages (frames) the file holds, reading at most `max_pages` + 1 page headers."""
    if not getattr(image, "is_animated", False):  # not `n_frames`: a TIFF's walks every page header
        return 1
    count = 1
    try:
        while count <= max_pages:
            image.seek(count)
            count += 1
    except EOFError:
        return count
    except (OSError, ValueError, SyntaxError) as exc:
        raise DocumentRejected(f"{name} is not a readable image (page {count + 1}: {exc})") from None
    finally:
        image.seek(0)
    raise DocumentRejected(
        f"{name} has more than {max_pages:,} pages to read by OCR; at most {max_pages:,} per document (RAG_MAX_OCR_PAGES)",
        limit=max_pages,
    )


def _check_size(image: Image.Image, name: str, page: int) -> None:
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise DocumentRejected(
            f"{name}: page {page} is {width:,} x {height:,} pixels ({width * height / 1e6:,.0f} MP); "
            f"at most {MAX_PIXELS / 1e6:g} MP per page",
            limit=MAX_PIXELS,
        )


def _page_pixels(image: Image.Image, index: int, name: str) -> Any:
    """Page `index` decoded, upright, grayscale, at most MAX_SIDE pixels on its long side, as a numpy array."""
    import numpy as np

    image.seek(index)
    _check_size(image, name, index + 1)
    try:
        image.draft("L", (MAX_SIDE, MAX_SIDE))  # JPEG decodes at a reduced scale directly; others ignore it
        page = ImageOps.exif_transpose(image).convert("L")
        page.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DocumentRejected(f"{name} is not a readable image (page {index + 1}: {exc})") from None
    return np.asarray(page)
