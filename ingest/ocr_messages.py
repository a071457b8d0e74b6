"""What crosses the sockets for the OCR of one page, between a parser worker, the parent and an OCR worker.

    parser worker -> parent:   PageImage(image, number, total)   (`ingest.sandbox`)
    parent -> OCR worker:      PageImage                         (`ingest.ocr_pool`)
    OCR worker -> parent:      PageLines(lines) | OcrFailed(why, memory)
    parent -> parser worker:   PageLines(lines) | PageLeftOut(why)

Each is pickled over a socket pair (multiprocessing's Connection), so both ends are our code: a worker
that gets another message than it expects has a bug, not a hostile file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.loaders.ocr import OcrLine


@dataclass(frozen=True, slots=True)
class PageImage:
    """A page image to read (a 2-D uint8 array), the `number`-th of the document's `total` (None: unknown)."""

    image: Any
    number: int = 1
    total: int | None = None


@dataclass(frozen=True, slots=True)
class PageLines:
    """The lines OCR read on a page."""

    lines: list[OcrLine]


@dataclass(frozen=True, slots=True)
class PageLeftOut:
    """The page was not read (over its time or memory, or its worker failed): why, for the warning."""

    why: str


@dataclass(frozen=True, slots=True)
class OcrFailed:
    """An OCR worker's last answer before it retires: it ran out of memory, or the engine failed."""

    why: str
    memory: bool = False


OcrAnswer = PageLines | PageLeftOut  # what the parent answers a parser worker's PageImage with
