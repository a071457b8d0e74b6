"""DOCX: paragraphs and tables in reading order, with Word's heading styles as heading paths.

Before python-docx sees the file, `check_archive` inflates every member itself, in bounded steps,
counting the bytes that really come out (a zip bomb is caught at the cap, and a directory that
understates a member's size is caught the moment the output passes the stated size), and feeds every
XML part through expat with defusedxml's refusals: a DOCTYPE, an external entity or a billion-laughs
entity tree is refused, never resolved. Word never writes a DTD, so nothing legitimate is lost.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile
import zlib
from typing import Any
from xml.etree.ElementTree import ParseError
from xml.parsers import expat

import defusedxml
import docx
from docx.document import Document as DocxDocument
from docx.table import Table
from docx.text.paragraph import Paragraph

from rag.core.errors import DocumentRejected

from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder, clean
from .tables import markdown_table

MAX_MEMBERS = 10_000
_STEP = 1 << 20  # bytes of output per inflate step
_LOCAL_HEADER = struct.Struct("<4s22xHH")
_XML_NAMES = (".xml", ".rels")
_HEADING_STYLE = re.compile(r"(?:heading|标题)\s*([1-9])", re.I)
_CAPTION = re.compile(r"(?:table|tab\.|表)\s*\d", re.I)


def load_docx(data: bytes, name: str, max_inflated: int) -> LoadedDocument:
    """Headings, paragraphs and tables of a DOCX, after `check_archive`."""
    check_archive(data, name, max_inflated)
    try:
        document = docx.Document(io.BytesIO(data))
    except (KeyError, ValueError, zipfile.BadZipFile, ParseError) as exc:
        raise DocumentRejected(f"{name} is not a readable DOCX ({type(exc).__name__}: {exc})") from exc
    levels = _heading_levels(document)
    builder = DocumentBuilder()
    caption = ""  # a caption paragraph waits: it names the table that follows it
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            builder.block(caption)
            caption = ""
            text = clean(block.text).strip()
            level = levels.get(block._p.style or "")
            if level is not None and text:
                builder.heading(text, level)
            elif _is_caption(block, text):
                caption = text
            else:
                builder.block(text)
        elif isinstance(block, Table):
            table = markdown_table(_table_rows(block), caption=caption or None)
            caption = ""
            if table is not None:
                builder.table(table.text, table.header)
    builder.block(caption)
    title = (document.core_properties.title or "").strip() or None
    return builder.build(name, DocKind.DOCX, title=title)


def _heading_levels(document: DocxDocument) -> dict[str, int]:
    """Style id -> heading level (Title is 0, Heading N is N), from style names or outline levels."""
    levels: dict[str, int] = {}
    for style in document.styles:
        style_name = (style.name or "").strip()
        if style_name.lower() == "title":
            levels[style.style_id] = 0
        elif (match := _HEADING_STYLE.fullmatch(style_name)) is not None:
            levels[style.style_id] = int(match.group(1))
        elif (outline := _outline_level(style.element)) is not None:
            levels[style.style_id] = outline
    return levels


def _outline_level(element: object) -> int | None:
    from docx.oxml.ns import qn

    found = element.find(f"{qn('w:pPr')}/{qn('w:outlineLvl')}")  # type: ignore[attr-defined]
    if found is None:
        return None
    value = found.get(qn("w:val"), "")
    return int(value) + 1 if value.isdigit() and int(value) < 9 else None


def _is_caption(paragraph: Paragraph, text: str) -> bool:
    """Word's Caption style, or a short line that starts like one ("Table 3", "表 3")."""
    style = paragraph.style.name if paragraph.style is not None else ""
    return bool(text) and len(text) <= 160 and ((style or "").lower() == "caption" or _CAPTION.match(text) is not None)


def _table_rows(table: Table) -> list[list[str]]:
    """The table's rows of cell texts; the first row is taken as its header."""
    rows = []
    for row in table.rows:
        cells, seen = [], set()
        for cell in row.cells:
            # A merged cell appears once per grid column it spans: its text once, the columns kept.
            cells.append("" if id(cell._tc) in seen else " ".join(clean(cell.text).split()))
            seen.add(id(cell._tc))
        rows.append(cells)
    return rows


def check_archive(data: bytes, name: str, max_inflated: int) -> None:
    """Inflates every member with a running cap and vets every XML part; DocumentRejected on any trick."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise DocumentRejected(f"{name} has {len(members)} ZIP members; a DOCX has a few dozen")
    declared = sum(m.file_size for m in members)
    if declared > max_inflated:
        raise DocumentRejected(f"{name} would inflate to {declared:,} bytes, over the {max_inflated:,}-byte limit")
    budget = max_inflated
    for member in members:
        budget -= _inflate_member(data, member, name, budget)


def _inflate_member(data: bytes, member: zipfile.ZipInfo, name: str, budget: int) -> int:
    """Bytes `member` really inflates to (checking its XML on the way); rejects past the budget or its header."""
    if member.flag_bits & 0x1:
        raise DocumentRejected(f"{name} has an encrypted ZIP member ({member.filename})")
    if member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise DocumentRejected(f"{name} uses a ZIP compression Word never writes ({member.compress_type})")
    raw = _member_bytes(data, member, name)
    inflater = zlib.decompressobj(-zlib.MAX_WBITS) if member.compress_type == zipfile.ZIP_DEFLATED else None
    parser = _XmlCheck(member.filename) if _maybe_xml(member.filename) else None
    total = 0
    out: bytes | memoryview
    pending: bytes | memoryview = raw
    while True:
        if inflater is None:
            out, pending = pending[:_STEP], pending[_STEP:]
        else:
            try:
                out = inflater.decompress(pending, _STEP) if pending else inflater.flush()
            except zlib.error as exc:
                raise DocumentRejected(f"{name} has a corrupt ZIP member {member.filename} ({exc})") from exc
            pending = inflater.unconsumed_tail
        total += len(out)
        if total > member.file_size:
            raise DocumentRejected(
                f"{name} is a zip bomb: {member.filename} inflates past the {member.file_size:,} bytes its header states"
            )
        if total > budget:
            raise DocumentRejected(f"{name} is a zip bomb: it inflates past the {budget:,}-byte limit")
        if parser is not None:
            parser.feed(bytes(out), name)  # a stored member's slices are views of the file
        if not out and not pending:
            break
    if total != member.file_size:
        raise DocumentRejected(
            f"{name}: {member.filename} inflates to {total:,} bytes, not the {member.file_size:,} stated"
        )
    if parser is not None:
        parser.close(name)
    return total


def _member_bytes(data: bytes, member: zipfile.ZipInfo, name: str) -> memoryview:
    head = data[member.header_offset : member.header_offset + _LOCAL_HEADER.size]
    if len(head) < _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise DocumentRejected(f"{name} has a broken ZIP entry for {member.filename}")
    _, name_len, extra_len = _LOCAL_HEADER.unpack(head)
    start = member.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    return memoryview(data)[start : start + member.compress_size]


_BINARY_MEDIA = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".emf", ".wmf", ".ico", ".webp")


def _maybe_xml(filename: str) -> bool:
    """Every part but the images in word/media/: a main document part can be put anywhere (its
    relationship names it), so a folder alone vouches for nothing; an SVG is XML and checked too."""
    return not (filename.startswith("word/media/") and filename.lower().endswith(_BINARY_MEDIA))


class _XmlCheck:
    """Feeds a member's bytes to expat with every DTD hook set to refuse.

    defusedxml's rules and exceptions, on a bare expat parser: with no element handlers the parse
    stays in C (defusedxml's ElementTree parser calls Python for every element, 20x slower here).
    What expat cannot read is refused, not skipped: lxml (python-docx's parser) reads encodings expat
    does not (UTF-32, EBCDIC), and a part we could not check must not reach it. Only a member that is
    neither named as XML nor starts like XML is taken for a binary blob and left alone.
    """

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.parser: Any = None
        self.first = True
        self.unreadable: str | None = None  # expat's complaint, reported once the member is inflated

    def feed(self, chunk: bytes, name: str) -> None:
        if self.first:
            self.first = False
            looks_xml = chunk.lstrip(b" \t\r\n\xef\xbb\xbf\xff\xfe\x00").startswith(b"<")
            if not looks_xml and not self.filename.lower().endswith(_XML_NAMES):
                return  # a binary blob python-docx keeps as bytes
            self.parser = _refusing_parser()
        if self.parser is not None:
            self._parse(chunk, name, final=not chunk)

    def _parse(self, chunk: bytes, name: str, final: bool) -> None:
        try:
            self.parser.Parse(chunk, final)
        except defusedxml.DefusedXmlException as exc:
            raise DocumentRejected(
                f"{name} declares a DTD or entities in {self.filename} ({type(exc).__name__}); refused unparsed"
            ) from exc
        except expat.ExpatError as exc:
            self.parser, self.unreadable = None, expat.ErrorString(exc.code)

    def close(self, name: str) -> None:
        """Refuses the member if expat could not read it (after the size checks had their say)."""
        if self.unreadable is not None:
            raise DocumentRejected(
                f"{name}: {self.filename} is XML we cannot check ({self.unreadable}); refused unparsed"
            )


def _refusing_parser() -> Any:
    def doctype(name: str, sysid: str | None, pubid: str | None, has_internal_subset: bool) -> None:
        raise defusedxml.DTDForbidden(name, sysid, pubid)

    def entity(name: str, *args: Any) -> None:
        raise defusedxml.EntitiesForbidden(name, None, None, None, None, None)

    def external(context: str, base: str | None, sysid: str | None, pubid: str | None) -> int:
        raise defusedxml.ExternalReferenceForbidden(context, base, sysid, pubid)

    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = entity
    parser.UnparsedEntityDeclHandler = entity
    parser.ExternalEntityRefHandler = external
    return parser
