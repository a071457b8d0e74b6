"""Plain text and Markdown. The extracted text is the file's own text (newlines normalised); Markdown
headings (ATX `#` and setext underlines, outside fenced code) give the sections their heading paths."""

from __future__ import annotations

import re

from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder, clean

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_NOT_PARAGRAPH = re.compile(r"^\s*(?:$|[-*+>|]|\d+[.)]\s|#|`{3}|~{3})")


def load_text(text: str, name: str, encoding: str | None = None) -> LoadedDocument:
    """One section holding the whole text."""
    builder = DocumentBuilder()
    builder.block(text)  # which cleans it
    return builder.build(name, DocKind.TEXT, encoding=encoding)


def load_markdown(text: str, name: str, encoding: str | None = None) -> LoadedDocument:
    """Sections split at headings, each with its heading path; the Markdown source is kept as is."""
    text = clean(text)
    builder = DocumentBuilder()
    title = None
    cursor = 0
    for start, end, level, heading in markdown_headings(text):
        builder.block(text[cursor:start], sep="")
        builder.heading(heading, level, raw=text[start:end], sep="")
        title = title or (heading if level == 1 else None)
        cursor = end
    builder.block(text[cursor:], sep="")
    return builder.build(name, DocKind.MARKDOWN, title=title, encoding=encoding)


def markdown_headings(text: str) -> list[tuple[int, int, int, str]]:
    """(start, end, level, title) of each heading line (setext headings span two lines)."""
    headings: list[tuple[int, int, int, str]] = []
    fence: str | None = None
    prev: tuple[int, str] | None = None  # offset and text of the previous line, if it was paragraph text
    offset = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        start, offset = offset, offset + len(line)
        if (match := _FENCE.match(body)) is not None:
            marker = match.group(1)
            if fence is None:
                fence = marker[0] * 3
            elif marker.startswith(fence):
                fence = None
            prev = None
            continue
        if fence is not None:
            continue
        if (atx := _ATX.match(body)) is not None:
            headings.append((start, start + len(body), len(atx.group(1)), (atx.group(2) or "").strip()))
            prev = None
        elif (setext := _SETEXT.match(body)) is not None and prev is not None:
            level = 1 if setext.group(1).startswith("=") else 2
            headings.append((prev[0], start + len(body), level, prev[1].strip()))
            prev = None
        else:
            prev = None if _NOT_PARAGRAPH.match(body) else (start, body)
    return headings
