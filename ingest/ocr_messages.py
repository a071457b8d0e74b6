"""What crosses the sockets for the OCR of one page, between a parser worker, the parent and an OCR worker.

    parser worker -> parent:   PageImage(image, number, total)   (`ingest.sandbox`)
    parent -> OCR worker:      PageImage                         (`ingest.ocr_pool`)
    OCR worker -> parent:      PageLines(lines) | OcrFailed(why, memory)
    parent -> parser worker:   PageLines(lines) | PageLeftOut(why)   (`PageRead`, as the loaders take it)

Each is pickled over a socket pair (multiprocessing's Connection), so both ends are our code: a worker
that gets another message than it expects has a bug, not a hostile file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# One page's result is one type from the OCR worker up to the layout (`PageRead`): the loaders take it too.
from .loaders.ocr import PageLeftOut, PageLines, PageRead

__all__ = ["OcrFailed", "PageImage", "PageLeftOut", "PageLines", "PageRead"]


@dataclass(frozen=True, slots=True)
class PageImage:
    """A page image to read (a 2-D uint8 array), the `number`-th of the document's `total` (None: unknown)."""

    image: Any
    number: int = 1
    total: int | None = None


@dataclass(frozen=True, slots=True)
class OcrFailed:
    """An OCR worker's last answer before it retires: it ran out of memory, or the engine failed."""

    why: str
    memory: bool = False
