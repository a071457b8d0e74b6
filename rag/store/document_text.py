"""A document's text rebuilt from its chunks in the record, for the MCP document resource (the whole text)
and the page viewer (a chunk's context).

Each chunk's text is `lead` characters of repeated table caption and header (metadata `lead`, absent
when none), then the exact slice [start, end) of the document's text (`ingest.chunking`): so overlapping
chunks agree where they overlap, and the header repeated for each chunk of rows is not the document's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Chunk = tuple[str, dict[str, Any]]  # (text, metadata) as the lexical record gives them


def placed(text: str, meta: dict[str, Any]) -> tuple[int, int, str] | None:
    """(start, end, the document's text there) of a chunk; None for one without offsets."""
    start, end = meta.get("start"), meta.get("end")
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    return start, end, text[int(meta.get("lead") or 0) :][: end - start]


def characters(chunks: Iterable[Chunk]) -> dict[int, str]:
    """The document's characters the chunks hold, by offset."""
    chars: dict[int, str] = {}
    for text, meta in chunks:
        if (where := placed(text, meta)) is not None:
            start, _, body = where
            for offset, char in enumerate(body):
                chars.setdefault(start + offset, char)
    return chars


def stitched(chunks: list[Chunk]) -> str:
    """The document's text: the chunks' slices in order, each overlap once, a line break where they leave
    a gap of one character (whitespace the chunker stripped: between table rows), a blank line for a wider
    one (between paragraphs); chunks without offsets joined in their place."""
    parts: list[str] = []
    covered = -1
    for text, meta in sorted(chunks, key=lambda c: (int(c[1].get("start", 0)), int(c[1].get("index", 0)))):
        where = placed(text, meta)
        if where is None:
            parts.append(("\n\n" if parts else "") + text)
            continue
        start, end, body = where
        if end <= covered:
            continue
        if start >= covered:
            parts.append(("\n" * min(start - covered, 2) if parts else "") + body)
        else:
            parts.append(body[covered - start :])
        covered = end
    return "".join(parts)
