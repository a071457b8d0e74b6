"""Scanned-looking pages made here: text rendered with Pillow (DejaVu Sans or Serif, Noto Sans CJK SC), then
tilted, speckled and JPEG-compressed like a scanner's or a phone's output, as images or image-only PDFs;
`two_columns` and `rough` make the pages of a printed report as an office scanner gives them back.

Shared by the OCR tests and bench/scanned.py; needs Debian's fonts-dejavu-core and fonts-noto-cjk.
"""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

LATIN_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
SERIF_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf")
CJK_FONT = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
_CJK_SC = 2  # the face of the collection drawn with simplified Chinese glyphs
_CJK = re.compile(r"[\u3000-\u9fff\uff00-\uffef]")
A4_INCHES = (8.27, 11.69)


def font(text: str, pixels: int, serif: bool = False) -> ImageFont.FreeTypeFont:
    """Noto Sans CJK SC for text with Chinese in it, DejaVu Sans (or Serif) otherwise."""
    if _CJK.search(text):
        return ImageFont.truetype(str(CJK_FONT), pixels, index=_CJK_SC)
    return ImageFont.truetype(str(SERIF_FONT if serif else LATIN_FONT), pixels)


def wrap(text: str, face: ImageFont.FreeTypeFont, width: float) -> list[str]:
    """Lines of `text` no wider than `width` pixels: at spaces, or between any two characters of Chinese."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        units = list(paragraph) if _CJK.search(paragraph) else paragraph.split(" ")
        joiner = "" if _CJK.search(paragraph) else " "
        line = ""
        for unit in units:
            candidate = f"{line}{joiner}{unit}" if line else unit
            if line and face.getlength(candidate) > width:
                lines.append(line)
                line = unit
            else:
                line = candidate
        lines.append(line)
    return lines


def render_page(paragraphs: list[str], dpi: int = 200, point_size: float = 11.0) -> Image.Image:
    """A clean white A4 page with `paragraphs` in black, an inch of margin, at `dpi`."""
    width, height = (round(side * dpi) for side in A4_INCHES)
    page = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(page)
    pixels = round(point_size * dpi / 72)
    y = dpi
    for paragraph in paragraphs:
        face = font(paragraph, pixels)
        for line in wrap(paragraph, face, width - 2 * dpi):
            if y + pixels * 1.5 > height - dpi * 0.6:
                raise ValueError("the paragraphs do not fit on one page")
            draw.text((dpi, y), line, font=face, fill=0)
            y += round(pixels * 1.5)
        y += pixels
    return page


def two_columns(
    left: str,
    right: str,
    header: str,
    number: str,
    dpi: int = 200,
    point_size: float = 10.0,
    serif: bool = False,
) -> Image.Image:
    """A white A4 page of two columns (`left`, then `right`), a running `header` over them and the page
    `number` centred under them, 0.8 inch margins, at `dpi`; ValueError when a column overflows."""
    width, height = (round(side * dpi) for side in A4_INCHES)
    page = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(page)
    pixels = round(point_size * dpi / 72)
    margin, gutter = round(0.8 * dpi), round(0.3 * dpi)
    column = (width - 2 * margin - gutter) // 2
    for n, text in enumerate((left, right)):
        face = font(text, pixels, serif)
        y = margin + pixels * 2
        for line in wrap(text, face, column):
            if y + pixels * 1.4 > height - margin:
                raise ValueError("the column does not fit on the page")
            draw.text((margin + n * (column + gutter), y), line, font=face, fill=0)
            y += round(pixels * 1.4)
    small = font(header + number, round(pixels * 0.85), serif)
    draw.text((margin, round(margin * 0.6)), header, font=small, fill=0)
    draw.text(((width - small.getlength(number)) / 2, height - round(margin * 0.6)), number, font=small, fill=0)
    return page


def rough(page: Image.Image, seed: int, skew: float = 1.5) -> Image.Image:
    """`page` as a worn office scanner gives it back: tilted up to `skew` degrees, blurred (0.5-1.1 px),
    grey noise and dark speckle, JPEG at quality 60-75 (each drawn from `seed`)."""
    rng = random.Random(seed)
    tilted = page.rotate(rng.uniform(-skew, skew), resample=Image.Resampling.BICUBIC, fillcolor=255)
    soft = tilted.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 1.1)))
    noise = np.random.default_rng(seed)
    pixels = np.asarray(soft, dtype=np.float32) + noise.normal(0, 12, (soft.height, soft.width))
    pixels[noise.random(pixels.shape) < 0.002] = rng.uniform(0, 90)  # toner specks and dust
    buffer = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=rng.randint(60, 75))
    return Image.open(io.BytesIO(buffer.getvalue()))


def scanned(
    page: Image.Image, seed: int, skew: float = 1.0, noise: float = 10.0, jpeg_quality: int = 60
) -> Image.Image:
    """`page` as a flatbed scanner gives it: tilted up to `skew` degrees, grey noise, JPEG artefacts."""
    rng = random.Random(seed)
    tilted = page.rotate(rng.uniform(-skew, skew), resample=Image.Resampling.BICUBIC, fillcolor=255)
    grain = np.random.default_rng(seed).normal(0, noise, (tilted.height, tilted.width))
    noisy = Image.fromarray((np.asarray(tilted, dtype=np.float32) + grain).clip(0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    noisy.save(buffer, "JPEG", quality=jpeg_quality)
    return Image.open(io.BytesIO(buffer.getvalue()))


def photographed(page: Image.Image, seed: int) -> Image.Image:
    """`page` as a phone photo of it: tilted 2-3 degrees on a grey desk, lit unevenly, soft, noisy, colour."""
    rng = random.Random(seed)
    tilted = page.rotate(
        rng.choice((-1, 1)) * rng.uniform(2, 3), resample=Image.Resampling.BICUBIC, expand=True, fillcolor=120
    )
    pixels = np.asarray(tilted.filter(ImageFilter.GaussianBlur(0.8)), dtype=np.float32)
    rows, cols = np.mgrid[0 : pixels.shape[0], 0 : pixels.shape[1]]
    light = 0.75 + 0.25 * (cols / pixels.shape[1]) * (1 - 0.5 * rows / pixels.shape[0])  # a lamp on the right
    pixels = pixels * light + np.random.default_rng(seed).normal(0, 8, pixels.shape)
    grey = pixels.clip(0, 255).astype(np.uint8)
    colour = np.stack([grey, (grey * 0.97).astype(np.uint8), (grey * 0.9).astype(np.uint8)], axis=-1)  # warm light
    return Image.fromarray(colour, "RGB")


def image_bytes(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def image_pdf(pages: list[Image.Image], dpi: int = 200) -> bytes:
    """An image-only PDF of `pages` (no text layer), as a scanner writes one."""
    buffer = io.BytesIO()
    pages[0].save(buffer, "PDF", resolution=dpi, save_all=True, append_images=pages[1:])
    return buffer.getvalue()


def scan_of_pdf(data: bytes, dpi: int = 200, seed: int = 0) -> bytes:
    """A born-digital PDF printed and scanned back: each page rendered at `dpi`, then `scanned` (a
    seed per page), as an image-only PDF."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(data)
    try:
        pages = []
        for index in range(len(pdf)):
            page = pdf[index]
            bitmap = page.render(scale=dpi / 72, grayscale=True)
            pages.append(scanned(bitmap.to_pil().convert("L"), seed=seed + index))
            bitmap.close()
            page.close()
    finally:
        pdf.close()
    return image_pdf(pages, dpi=dpi)


def furnished(page: Image.Image, header: str, footer: str, dpi: int = 200, point_size: float = 9.0) -> Image.Image:
    """`page` (from `render_page`) with a running header in its top margin and a footer (a page number)
    centred in its bottom margin, as a printed report has them."""
    page = page.copy()
    draw = ImageDraw.Draw(page)
    pixels = round(point_size * dpi / 72)
    face = font(header + footer, pixels)
    draw.text((dpi, round(dpi * 0.4)), header, font=face, fill=0)
    draw.text(((page.width - face.getlength(footer)) / 2, page.height - round(dpi * 0.5)), footer, font=face, fill=0)
    return page


def lines_page(lines: list[tuple[str, bool]], dpi: int = 200, point_size: float = 11.0) -> Image.Image:
    """A white page, 8.27 inches wide, with one line of text per (text, serif) in `lines`, 2 line heights apart."""
    pixels = round(point_size * dpi / 72)
    page = Image.new("L", (round(A4_INCHES[0] * dpi), dpi + 2 * pixels * len(lines)), 255)
    draw = ImageDraw.Draw(page)
    for n, (text, serif) in enumerate(lines):
        draw.text((dpi // 2, dpi // 2 + 2 * pixels * n), text, font=font(text, pixels, serif), fill=0)
    return page
