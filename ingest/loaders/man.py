"""Man pages: troff source (`man` or `mdoc` macros, as `/usr/share/man/*/*.gz` hold them) read as text.

groff renders the page (`ingest.loaders.troff`, bounded and without file access); the rendered text is
then cut at its section headings: a line at the left margin is a section (NAME, SYNOPSIS, 描述...), a
bold line indented by less than the body is a subsection. The body keeps its lines, less the body's
indent; the page header and footer lines are dropped. tbl tables come out as markdown tables with their
first row as header (`ingest.loaders.tbl`), so a chunk of their rows keeps the header. A page that only
points to another (`.so man1/other.1`, a link) has nothing of its own: it is refused, saying so.
"""

from __future__ import annotations

import re
import shlex

from rag.core.errors import DocumentRejected

from ..detect import decode_text, man_link
from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder, clean
from .tables import markdown_table
from .tbl import Markers, read_table, rewrite_tables
from .troff import render_troff

_TITLE = re.compile(r"^[.']\s*(TH|Dt)[ \t]+(.*)$", re.M)
_MDOC = re.compile(r"^[.']\s*Dd\b", re.M)
_BOLD = re.compile(r"(.)\x08\1")
_PAGE_TITLE_GAP = re.compile(r" {3,}")  # between the parts of the header and footer lines
_BLANKS = re.compile(r"\n{3,}")


def load_man(
    data: bytes, name: str, text: str | None = None, encoding: str | None = None, timeout_s: float = 30.0
) -> LoadedDocument:
    """The rendered page, sections at its headings, tables as tables."""
    if text is None:
        text, encoding = decode_text(data)
    if (link := man_link(text)) is not None:
        raise DocumentRejected(
            f"{name} is a link to another man page (.so {link}): that page is indexed under its own name"
        )
    markers = Markers.new()
    macros = "mdoc" if _MDOC.search(text) and not re.search(r"^[.']\s*TH\b", text, re.M) else "man"
    rendered = render_troff(rewrite_tables(text, markers), macros, name, timeout_s)
    builder = DocumentBuilder()
    _build(builder, _without_page_titles(rendered.split("\n")), markers)
    return builder.build(name, DocKind.MAN, title=man_title(text), encoding=encoding)


def man_title(text: str) -> str | None:
    """ "LS(1)" from `.TH LS 1 ...` (or mdoc's `.Dt`)."""
    match = _TITLE.search(text)
    if match is None:
        return None
    try:
        words = shlex.split(match.group(2))
    except ValueError:
        words = match.group(2).split()
    if not words:
        return None
    return clean(f"{words[0]}({words[1]})" if len(words) > 1 else words[0]).strip() or None


def _without_page_titles(lines: list[str]) -> list[str]:
    """The rendered lines less the page header (first: "LS(1)   User Commands   LS(1)") and footer (last:
    "GNU coreutils 9.1   2022-09   LS(1)", or mdoc's "BSD   May 1, 2020   BSD")."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if len(filled) < 2:
        return lines
    head = _title_parts(lines[filled[0]])
    drop = set()
    if len(head) > 1 and head[0] == head[-1]:
        drop.add(filled[0])
        foot = _title_parts(lines[filled[-1]])
        if foot[-1] == head[0] or len(foot) > 1 and foot[0] == foot[-1]:
            drop.add(filled[-1])
    return [line for i, line in enumerate(lines) if i not in drop]


def _title_parts(line: str) -> list[str]:
    return _PAGE_TITLE_GAP.split(clean(line).strip().casefold())


def _build(builder: DocumentBuilder, lines: list[str], markers: Markers) -> None:
    body: list[str] = []
    plain = [clean(line) for line in lines]
    i = 0
    while i < len(lines):
        if markers.table in plain[i]:
            _add_body(builder, body)
            rows, i = read_table(plain, i + 1, markers)
            if (md := markdown_table(rows)) is not None:
                builder.table(md.text, md.header)
            continue
        level = _heading_level(lines[i], plain[i])
        if level:
            _add_body(builder, body)
            builder.heading(plain[i].strip(), level)
        else:
            body.append(plain[i].rstrip())
        i += 1
    _add_body(builder, body)


def _heading_level(raw: str, plain: str) -> int:
    """1 for a section heading (at the margin), 2 for a subsection (bold, indented by three or less), else 0."""
    text = plain.lstrip(" ")
    if not text.strip():
        return 0
    indent = len(plain) - len(text)
    if indent == 0:
        return 1
    return 2 if indent <= 3 and not _BOLD.sub("", raw).strip() else 0


def _add_body(builder: DocumentBuilder, body: list[str]) -> None:
    """The lines since the last heading or table, less their common indent, as one block."""
    indents = [len(line) - len(line.lstrip(" ")) for line in body if line.strip()]
    if indents:
        cut = min(indents)
        builder.block(_BLANKS.sub("\n\n", "\n".join(line[cut:] for line in body)).strip("\n"))
    body.clear()
