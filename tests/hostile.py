"""Builders of ordinary and hostile files for the loader and upload tests.

Everything is built in memory from the standard library (plus python-docx for ordinary DOCX), so the
tests need no fixtures on disk and no PDF writer: the PDFs are written object by object, which is also
what lets us make them broken on purpose (an xref loop, a decompression bomb, an encrypted body).
"""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

# --- small binaries -------------------------------------------------------------------------------


def elf_executable() -> bytes:
    """The 64-byte header of an x86-64 ELF executable, padded like a real binary's first page."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, 0x401000, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    return header + bytes(4096 - len(header))


def png_image() -> bytes:
    """A valid 1x1 grey PNG."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b"")
    )


def png_bomb(side: int = 60_000) -> bytes:
    """A `side` x `side` 1-bit PNG (3.6 GP: 3.6 GB as the grayscale a loader decodes to) in a few KB: its
    first rows compressed, the rest left out, which a decoder only finds after allocating the image."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    rows = zlib.compress(bytes(1 + side // 8) * 64, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def tiff_of_pages(pages: int) -> bytes:
    """A little-endian TIFF of `pages` 1x1 white pages sharing one strip byte (90 bytes a page)."""
    tags = ((256, 3, 1), (257, 3, 1), (258, 3, 1), (259, 3, 1), (262, 3, 1), (273, 4, 8), (277, 3, 1), (279, 4, 1))
    out = bytearray(b"II*\x00" + struct.pack("<I", 10) + b"\xff\x00")  # header, then the strip byte at 8
    for page in range(pages):
        start = len(out)
        nxt = start + 2 + 12 * len(tags) + 4 if page + 1 < pages else 0
        out += struct.pack("<H", len(tags))
        for tag, kind, value in tags:
            out += struct.pack("<HHII", tag, kind, 1, value)
        out += struct.pack("<I", nxt)
    return bytes(out)


# --- PDF ------------------------------------------------------------------------------------------

_PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")


def _rc4(key: bytes, data: bytes) -> bytes:
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) & 0xFF
        s[i], s[j] = s[j], s[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) & 0xFF
        j = (j + s[i]) & 0xFF
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) & 0xFF])
    return bytes(out)


class _Rc4Security:
    """The PDF standard security handler, revision 2 (40-bit RC4): enough for PDFium to ask for a password."""

    PERMISSIONS = -44

    def __init__(self, user_password: str, owner_password: str, file_id: bytes) -> None:
        def pad(pw: str) -> bytes:
            return (pw.encode("latin-1") + _PAD)[:32]

        self.file_id = file_id
        self.owner_entry = _rc4(hashlib.md5(pad(owner_password)).digest()[:5], pad(user_password))
        perms = struct.pack("<i", self.PERMISSIONS)
        self.key = hashlib.md5(pad(user_password) + self.owner_entry + perms + file_id).digest()[:5]
        self.user_entry = _rc4(self.key, _PAD)

    def encrypt(self, num: int, data: bytes) -> bytes:
        object_key = hashlib.md5(self.key + num.to_bytes(3, "little") + b"\x00\x00").digest()[:10]
        return _rc4(object_key, data)

    def dictionary(self) -> bytes:
        return (
            b"<< /Filter /Standard /V 1 /R 2 /O <"
            + self.owner_entry.hex().encode()
            + b"> /U <"
            + self.user_entry.hex().encode()
            + b"> /P "
            + str(self.PERMISSIONS).encode()
            + b" >>"
        )


def _pdf_string(text: str) -> bytes:
    raw = text.encode("latin-1")
    return b"(" + raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def _text_content(lines: Sequence[str]) -> bytes:
    ops = [b"BT /F1 12 Tf 14 TL 72 720 Td"]
    for i, line in enumerate(lines):
        ops.append((b"T* " if i else b"") + _pdf_string(line) + b" Tj")
    ops.append(b"ET")
    return b"\n".join(ops)


def _stream(dictionary: bytes, data: bytes) -> bytes:
    return b"<< " + dictionary + b" /Length " + str(len(data)).encode() + b" >>\nstream\n" + data + b"\nendstream"


class PdfWriter:
    """Writes a PDF object by object: 1 is the catalog, 2 the page tree, 3 the font, pages follow."""

    def __init__(self) -> None:
        self.objects: dict[int, bytes] = {}
        self.streams: set[int] = set()
        self.page_ids: list[int] = []
        self.outline: int | None = None
        self.objects[3] = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"

    def _next_id(self) -> int:
        return max(self.objects, default=3) + 1

    def add_page(self, content: bytes, resources: bytes = b"/Font << /F1 3 0 R >>", content_dict: bytes = b"") -> int:
        content_id = self._next_id()
        self.objects[content_id] = _stream(content_dict, content)
        self.streams.add(content_id)
        page_id = content_id + 1
        self.objects[page_id] = (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << "
            + resources
            + b" >> /Contents "
            + str(content_id).encode()
            + b" 0 R >>"
        )
        self.page_ids.append(page_id)
        return page_id

    def add_object(self, body: bytes, stream: bool = False) -> int:
        num = self._next_id()
        self.objects[num] = body
        if stream:
            self.streams.add(num)
        return num

    def add_outline(self, entries: Sequence[tuple[str, int]]) -> None:
        """Top-level bookmarks: (title, 0-based page index)."""
        root = self._next_id()
        ids = list(range(root + 1, root + 1 + len(entries)))
        self.objects[root] = b"<< /Type /Outlines /First %d 0 R /Last %d 0 R /Count %d >>" % (ids[0], ids[-1], len(ids))
        for i, (title, page) in enumerate(entries):
            links = (b" /Prev %d 0 R" % ids[i - 1] if i else b"") + (
                b" /Next %d 0 R" % ids[i + 1] if i + 1 < len(ids) else b""
            )
            dest = b" /Dest [%d 0 R /XYZ 0 792 0]" % self.page_ids[page]
            self.objects[ids[i]] = (
                b"<< /Title " + _pdf_string(title) + b" /Parent %d 0 R" % root + dest + links + b" >>"
            )
        self.outline = root

    def build(self, security: _Rc4Security | None = None, prev_loop: bool = False, kids_loop: bool = False) -> bytes:
        kids = b" ".join(str(p).encode() + b" 0 R" for p in self.page_ids) + (b" 2 0 R" if kids_loop else b"")
        outlines = b" /Outlines %d 0 R" % self.outline if self.outline else b""
        self.objects[1] = b"<< /Type /Catalog /Pages 2 0 R" + outlines + b" >>"
        self.objects[2] = b"<< /Type /Pages /Kids [" + kids + b"] /Count " + str(len(self.page_ids)).encode() + b" >>"
        out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
        offsets: dict[int, int] = {}
        for num in sorted(self.objects):
            body = self.objects[num]
            if security is not None and num in self.streams:
                head, _, rest = body.partition(b"\nstream\n")
                data = rest[: -len(b"\nendstream")]
                body = head + b"\nstream\n" + security.encrypt(num, data) + b"\nendstream"
            offsets[num] = len(out)
            out += str(num).encode() + b" 0 obj\n" + body + b"\nendobj\n"
        size = max(self.objects) + 1
        trailer = b"/Size " + str(size).encode() + b" /Root 1 0 R"
        if security is not None:
            enc_offset = len(out)
            out += str(size).encode() + b" 0 obj\n" + security.dictionary() + b"\nendobj\n"
            offsets[size] = enc_offset
            size += 1
            file_id = security.file_id.hex().encode()
            trailer = b"/Size " + str(size).encode() + b" /Root 1 0 R /Encrypt " + str(size - 1).encode()
            trailer += b" 0 R /ID [<" + file_id + b"> <" + file_id + b">]"
        xref_at = len(out)
        out += b"xref\n0 " + str(size).encode() + b"\n0000000000 65535 f \n"
        for num in range(1, size):
            out += (b"%010d 00000 n \n" % offsets[num]) if num in offsets else b"0000000000 65535 f \n"
        if prev_loop:
            # A second xref section whose /Prev points back at the first, which points at it: a loop.
            second_at = len(out) + len(b"trailer\n<< " + trailer + b" /Prev 0000000000 >>\n")
            out += b"trailer\n<< " + trailer + b" /Prev " + b"%010d" % second_at + b" >>\n"
            out += (
                b"xref\n0 1\n0000000000 65535 f \ntrailer\n<< "
                + trailer
                + b" /Prev "
                + str(xref_at).encode()
                + b" >>\n"
            )
        else:
            out += b"trailer\n<< " + trailer + b" >>\n"
        out += b"startxref\n" + str(xref_at).encode() + b"\n%%EOF\n"
        return bytes(out)


def text_pdf(pages: Sequence[Sequence[str] | str], outline: Sequence[tuple[str, int]] = ()) -> bytes:
    """A PDF with one page per item, each page a list of text lines (Latin-1 only, Helvetica), and
    optional top-level bookmarks (title, 0-based page index)."""
    writer = PdfWriter()
    for page in pages:
        writer.add_page(_text_content([page] if isinstance(page, str) else page))
    if outline:
        writer.add_outline(outline)
    return writer.build()


def encrypted_pdf(text: str = "Secret quarterly numbers", user_password: str = "user-pw") -> bytes:
    """A PDF whose body is RC4-encrypted and needs a user password to open."""
    writer = PdfWriter()
    writer.add_page(_text_content([text]))
    return writer.build(security=_Rc4Security(user_password, "owner-pw", hashlib.md5(b"rag-test").digest()))


def image_only_pdf() -> bytes:
    """A one-page PDF holding a single grey image and no text: what a scanner produces."""
    writer = PdfWriter()
    pixels = bytes((x * 16 + y) & 0xFF for y in range(16) for x in range(16))
    image = writer.add_object(
        _stream(
            b"/Type /XObject /Subtype /Image /Width 16 /Height 16 /ColorSpace /DeviceGray /BitsPerComponent 8", pixels
        ),
        stream=True,
    )
    writer.add_page(
        b"q 400 0 0 400 100 200 cm /Im1 Do Q", resources=b"/XObject << /Im1 " + str(image).encode() + b" 0 R >>"
    )
    return writer.build()


def mixed_scan_pdf(pages: Sequence[str | None], running_head: str = "") -> bytes:
    """A PDF of text pages (a str) and scanned pages (None: a page-sized grey image, and `running_head`
    as its only text, as a scanner's software stamps a page number)."""
    writer = PdfWriter()
    pixels = bytes((x * 16 + y) & 0xFF for y in range(16) for x in range(16))
    image = writer.add_object(
        _stream(
            b"/Type /XObject /Subtype /Image /Width 16 /Height 16 /ColorSpace /DeviceGray /BitsPerComponent 8", pixels
        ),
        stream=True,
    )
    resources = b"/Font << /F1 3 0 R >> /XObject << /Im1 " + str(image).encode() + b" 0 R >>"
    for text in pages:
        if text is not None:
            writer.add_page(_text_content([text]))
        else:
            head = b"\n" + _text_content([running_head]) if running_head else b""
            writer.add_page(b"q 612 0 0 792 0 0 cm /Im1 Do Q" + head, resources=resources)
    return writer.build()


def circular_xref_pdf(text: str = "A page behind a looping xref chain") -> bytes:
    """A PDF whose two cross-reference sections name each other as /Prev."""
    writer = PdfWriter()
    writer.add_page(_text_content([text]))
    return writer.build(prev_loop=True)


def page_tree_loop_pdf(text: str = "A page in a looping page tree") -> bytes:
    """A PDF whose page tree lists itself among its own kids."""
    writer = PdfWriter()
    writer.add_page(_text_content([text]))
    return writer.build(kids_loop=True)


def deflate_zeros(inflated_bytes: int, wbits: int = zlib.MAX_WBITS) -> bytes:
    """A deflate stream of `inflated_bytes` zero bytes, built in milliseconds by repeating one flushed block.

    After a full flush the compressor forgets its window, so one compressed mebibyte of zeros can be
    repeated verbatim. The checksum at the end is not computed (decoders hit their limits long before).
    """
    mib = 1 << 20
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = comp.compress(bytes(mib)) + comp.flush(zlib.Z_FULL_FLUSH)
    tail = comp.flush(zlib.Z_FINISH)
    body = block * (inflated_bytes // mib) + tail
    if wbits < 0:
        return body
    return b"\x78\xda" + body + b"\x00\x00\x00\x01"


def flate_bomb_pdf(inflated_bytes: int = 4 << 30, layers: int = 3) -> bytes:
    """A page whose content stream is zeros deflated `layers` times over: a few KB that inflate to GiBs."""
    data = deflate_zeros(inflated_bytes)
    for _ in range(layers - 1):
        data = zlib.compress(data, 9)
    filters = b"[" + b" ".join([b"/FlateDecode"] * layers) + b"]"
    writer = PdfWriter()
    writer.add_page(data, content_dict=b"/Filter " + filters)
    return writer.build()


# --- DOCX -----------------------------------------------------------------------------------------


def docx_document(
    blocks: Sequence[tuple[str, object]] = (),
) -> bytes:
    """A DOCX written by python-docx from ("heading1".."heading9" | "title" | "p" | "table", value) blocks."""
    import docx

    document = docx.Document()
    for kind, value in blocks:
        if kind == "title":
            document.add_heading(str(value), level=0)
        elif kind.startswith("heading"):
            document.add_heading(str(value), level=int(kind.removeprefix("heading")))
        elif kind == "p":
            document.add_paragraph(str(value))
        elif kind == "table":
            rows = list(value)  # type: ignore[call-overload]
            table = document.add_table(rows=len(rows), cols=len(rows[0]))
            for r, row in enumerate(rows):
                for c, cell in enumerate(row):
                    table.cell(r, c).text = str(cell)
        else:
            raise ValueError(kind)
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


def replace_zip_member(archive: bytes, name: str, data: bytes) -> bytes:
    """The archive with one member's content replaced (compressed normally)."""
    src = zipfile.ZipFile(io.BytesIO(archive))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, data if info.filename == name else src.read(info))
    return out.getvalue()


def raw_zip(members: Sequence[tuple[str, bytes, int, int]]) -> bytes:
    """A ZIP written by hand from (name, raw deflate data, declared inflated size, crc) members.

    zipfile cannot store pre-compressed data or lie about sizes; this can, for the bomb tests.
    """
    out = bytearray()
    central = bytearray()
    for name, data, declared, crc in members:
        fname = name.encode()
        offset = len(out)
        fields = struct.pack("<HHHHHIII", 20, 0, 8, 0, 0x21, crc, len(data), declared)
        out += b"PK\x03\x04" + fields + struct.pack("<HH", len(fname), 0) + fname + data
        central += b"PK\x01\x02" + struct.pack("<H", 20) + fields
        central += struct.pack("<HHHHHII", len(fname), 0, 0, 0, 0, 0, offset) + fname
    count = len(members)
    end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, count, count, len(central), len(out), 0)
    return bytes(out + central + end)


def _deflated(data: bytes) -> bytes:
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    return comp.compress(data) + comp.flush()


def docx_zip_bomb(inflated_bytes: int = 2 << 30, lying_directory: bool = False) -> bytes:
    """A DOCX whose word/document.xml inflates to `inflated_bytes` (a few MB on disk).

    With `lying_directory` the headers claim the member inflates to 2 KB, so a reader that trusts
    the directory would see a small file.
    """
    normal = zipfile.ZipFile(io.BytesIO(docx_document([("p", "filler")])))
    members = []
    for info in normal.infolist():
        raw = normal.read(info)
        if info.filename == "word/document.xml":
            declared = 2048 if lying_directory else inflated_bytes
            members.append((info.filename, deflate_zeros(inflated_bytes, wbits=-15), declared, 0))
        else:
            members.append((info.filename, _deflated(raw), len(raw), zlib.crc32(raw)))
    return raw_zip(members)


_BODY = (
    '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
    "<w:body><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:body></w:document>"
)


def docx_with_document_xml(document_xml: str) -> bytes:
    """An otherwise valid DOCX whose word/document.xml is `document_xml`."""
    return replace_zip_member(docx_document([("p", "placeholder")]), "word/document.xml", document_xml.encode())


def docx_with_doctype() -> bytes:
    return docx_with_document_xml('<?xml version="1.0"?><!DOCTYPE w:document []>' + _BODY.format(text="plain"))


def docx_with_external_entity() -> bytes:
    return docx_with_document_xml(
        '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>' + _BODY.format(text="&xxe;")
    )


def docx_billion_laughs() -> bytes:
    entities = ['<!ENTITY lol0 "lol">'] + [
        f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">' for i in range(1, 10)
    ]
    return docx_with_document_xml(
        '<?xml version="1.0"?><!DOCTYPE d [' + "".join(entities) + "]>" + _BODY.format(text="&lol9;")
    )


# --- HTML -----------------------------------------------------------------------------------------

HTML_SECRET_SCRIPT = "window.stealCookies()"


def html_with_scripts_and_remote_resources() -> bytes:
    """A page full of things a loader must not run, fetch or index, around a short article."""
    return f"""<!DOCTYPE html>
<html><head><title>Field notes</title>
<meta charset="utf-8">
<link rel="stylesheet" href="http://198.51.100.7/site.css">
<script src="http://198.51.100.7/tracker.js"></script>
<script>{HTML_SECRET_SCRIPT}; fetch("http://198.51.100.7/beacon")</script>
<style>body {{ background: url("http://198.51.100.7/bg.png") }}</style>
</head><body>
<header><a href="/">Home</a> <a href="/about">About us</a></header>
<nav><ul><li>Menu entry one</li><li>Menu entry two</li></ul></nav>
<main>
<h1>Observing herons</h1>
<p>Herons stand still for long minutes before they strike.</p>
<img src="http://198.51.100.7/heron.jpg" alt="a heron">
<iframe src="http://198.51.100.7/embed"></iframe>
<div hidden>Hidden by attribute</div>
<div style="display: none">Hidden by style</div>
<span aria-hidden="true">Hidden from readers</span>
<noscript>Please enable JavaScript</noscript>
<template><p>Template text</p></template>
<h2>Where to look</h2>
<p>Shallow water at dawn is best.</p>
</main>
<footer>Copyright footer text</footer>
<script>console.log("late script")</script>
</body></html>""".encode()


def shared_stream_pdf(pages: int, lines: int = 40) -> bytes:
    """A PDF of `pages` pages that all draw one content stream: small on disk, huge once extracted."""
    writer = PdfWriter()
    content = writer.add_object(
        _stream(b"", _text_content([f"line {i} of the page everyone shares" for i in range(lines)])), stream=True
    )
    for _ in range(pages):
        writer.page_ids.append(
            writer.add_object(
                b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>"
                % content
            )
        )
    return writer.build()


def zip_directory_flood(entries: int, shared_header: bool = False, zip64_behind_small_record: bool = False) -> bytes:
    """A ZIP of `entries` empty stored members: a central directory of ~60 bytes an entry, nothing else.

    With `shared_header` every directory entry points at one local header, so the file is almost all
    directory (900,017 entries in 46.8 MB, the flood that cost the API 450 MB). With
    `zip64_behind_small_record` the classic end record says "2 entries, 100 bytes" and a ZIP64 record
    before it gives the true counts, which `zipfile` reads anyway.
    """
    local = bytearray()
    central = bytearray()
    fields = struct.pack("<HHHHHIII", 20, 0, 0, 0, 0x21, 0, 0, 0)
    for i in range(entries):
        fname = b"%06x" % i if shared_header else b"f%07d.txt" % i
        offset = 0 if shared_header else len(local)
        if not shared_header or i == 0:
            local += b"PK\x03\x04" + fields + struct.pack("<HH", len(fname), 0) + fname
        central += (
            b"PK\x01\x02"
            + struct.pack("<H", 20)
            + fields
            + struct.pack("<HHHHHII", len(fname), 0, 0, 0, 0, 0, offset)
            + fname
        )
    count = min(entries, 0xFFFF)
    if not zip64_behind_small_record:
        end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, count, count, len(central), len(local), 0)
        return bytes(local + central + end)
    record64_at = len(local) + len(central)
    record64 = b"PK\x06\x06" + struct.pack("<QHHLLQQQQ", 44, 45, 45, 0, 0, entries, entries, len(central), len(local))
    locator = b"PK\x06\x07" + struct.pack("<LQL", 0, record64_at, 1)
    end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 2, 2, 100, len(local), 0)
    return bytes(local + central + record64 + locator + end)


def docx_with_encoded_document_xml(encoding: str, codec: str | None = None) -> bytes:
    """A DOCX whose word/document.xml declares an entity and is written in `encoding` (with its BOM, if any)."""
    xml = f'<?xml version="1.0" encoding="{encoding}"?><!DOCTYPE d [<!ENTITY e "expanded">]>' + _BODY.format(text="&e;")
    return replace_zip_member(docx_document([("p", "placeholder")]), "word/document.xml", xml.encode(codec or encoding))


# --- requests sent by hand, to see when the server answers -----------------------------------------


def send_until_answered(
    url: str, path: str, headers: dict[str, str], chunks: Iterable[bytes], timeout: float = 30.0
) -> tuple[int, int, bytes]:
    """POST `chunks` over a raw socket, looking for an answer before each chunk.

    Returns (status, bytes of body sent before the answer came, the answer's head and body). An HTTP
    client library sends the whole body before it reads, so it cannot show that a server refused early.
    """
    import select
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
    head = f"POST {path} HTTP/1.1\r\nHost: {parsed.hostname}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sent = 0
    try:
        sock.sendall(head.encode() + b"\r\n")
        # poll, not select: select() takes no descriptor past 1023, which a long test session can reach.
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        for chunk in chunks:
            if poller.poll(0):
                break
            try:
                sock.sendall(chunk)
            except OSError:  # closed by the server: its answer may already be waiting
                break
            sent += len(chunk)
        answer = _read_answer(sock)
    finally:
        sock.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, sent, answer


def _read_answer(sock: Any) -> bytes:
    answer = b""
    while b"\r\n\r\n" not in answer or not _complete(answer):
        try:
            data = sock.recv(65536)
        except OSError:
            break
        if not data:
            break
        answer += data
    return answer


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False
