"""File type from the file's bytes.

`detect(data, name)` returns the `DocKind` to load, or raises `UnsupportedFileType` naming what it saw
("ELF executable", "GIF image", "ZIP archive (not a DOCX)"). PNG, JPEG, TIFF, WebP and BMP images are
`DocKind.IMAGE` (read by OCR). Binary formats are recognised by their
signature alone; the name and any Content-Type are never trusted. Only among text-like content does
the name's extension break a tie: a `.md` name makes plain text markdown, a `.txt` name keeps a page
with stray tags plain text unless it is unmistakably an HTML document.

Text files are decoded here too (`decode_text`), since telling text from binary needs the decoding.
"""

from __future__ import annotations

import codecs
import io
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePath

from rag.core.errors import DocumentRejected, UnsupportedFileType

from .models import DocKind

# Leading bytes of binary formats we refuse, checked in order (longer, more specific ones first).
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x7fELF", "ELF executable"),
    (b"MZ", "Windows executable (PE/DOS)"),
    (b"\xfe\xed\xfa\xce", "Mach-O executable"),
    (b"\xfe\xed\xfa\xcf", "Mach-O executable"),
    (b"\xce\xfa\xed\xfe", "Mach-O executable"),
    (b"\xcf\xfa\xed\xfe", "Mach-O executable"),
    (b"\xca\xfe\xba\xbe", "Mach-O universal binary or Java class"),
    (b"\x00asm", "WebAssembly module"),
    (b"GIF87a", "GIF image"),
    (b"GIF89a", "GIF image"),
    (b"\x00\x00\x01\x00", "ICO image"),
    (b"8BPS", "Photoshop image"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "OLE2 compound file (legacy .doc/.xls/.ppt or an encrypted Office file)"),
    (b"{\\rtf", "RTF document"),
    (b"%!PS", "PostScript document"),
    (b"\x1f\x8b", "gzip archive"),
    (b"BZh", "bzip2 archive"),
    (b"\xfd7zXZ\x00", "xz archive"),
    (b"\x28\xb5\x2f\xfd", "Zstandard archive"),
    (b"7z\xbc\xaf\x27\x1c", "7-Zip archive"),
    (b"Rar!\x1a\x07", "RAR archive"),
    (b"SQLite format 3\x00", "SQLite database"),
    (b"OggS", "Ogg media"),
    (b"fLaC", "FLAC audio"),
    (b"ID3", "MP3 audio"),
    (b"\x1aE\xdf\xa3", "Matroska/WebM video"),
    (b"wOFF", "WOFF font"),
    (b"wOF2", "WOFF2 font"),
    (b"PAR1", "Parquet file"),
    (b"\x93NUMPY", "NumPy array"),
    (b"\x80\x04\x95", "Python pickle"),
    (b"GGUF", "GGUF model file"),
)
# Images we read by OCR (PNG, JPEG, TIFF, WebP, BMP); GIF, ICO and the rest stay refused.
_IMAGE_MAGICS = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"II*\x00", b"MM\x00*")
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")
_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)
_HTML_DOC = re.compile(
    r"\A(?:\s|<!--.*?-->|<\?xml[^>]*>)*<(?:!doctype\s+html|html[\s>]|head[\s>]|body[\s>])", re.I | re.S
)
_HTML_TAGS = re.compile(
    r"</(?:p|div|span|a|li|ul|ol|table|tr|td|th|h[1-6]|body|html|section|article|em|strong|b|i|pre|blockquote)>", re.I
)
_MD_SIGNS = re.compile(
    r"^(?:#{1,6}[ \t]+\S|```|~~~|[ \t]*[-*+][ \t]+\S.*\n[ \t]*[-*+][ \t]+\S|\S.*\n(?:=+|-+)[ \t]*$)", re.M
)
# A man page's troff source: it opens with a request or a comment (`.\"`, `'\"`, `\"`) and has its title macro
# (`.TH` for man, `.Dd` for mdoc) in its first lines; a page that is only `.so other.1` links to another.
_TROFF_START = re.compile(r"\A(?:[ \t]*\n)*(?:[.']|\\\")[^\n]*\n")  # a request, or a comment
_TROFF_TITLE = re.compile(r"^[.']\s*(?:TH|Dd)[ \t]+\S", re.M)
_TROFF_LINK = re.compile(r"\A(?:[.']\\\".*\n|[ \t]*\n)*[.']\s*so[ \t]+(\S+)\s*\Z")
_TITLE_WITHIN_LINES = 400
_MD_EXTS = {".md", ".markdown", ".mdown", ".mkd", ".mdx"}
_HTML_EXTS = {".html", ".htm", ".xhtml", ".shtml"}
_CHARSET_DECL = re.compile(
    rb"""(?:<meta[^>]{0,200}?charset|<\?xml[^>]{0,100}?encoding)\s*=\s*["']?([A-Za-z0-9_.:-]{1,40})""", re.I
)
_PREFERRED_ON_TIE = ("cp1252", "latin_1", "iso8859_15", "gb18030", "big5", "shift_jis", "euc_kr")
_HEAD = 1 << 16  # characters at the head sniffed for text-kind signals
_WESTERN_PAGES = {"cp1252", "latin_1", "iso8859_15"}
# DOS and classic Mac code pages: charset_normalizer finds "language evidence" for them in short
# Western texts ("Für" as cp775 "F³r", "pequeño" as cp852 "peque˝o"), yet files in them are rare today:
# a plausible cp1252 reading wins over them whatever the evidence.
_LEGACY_PAGES = {
    "cp437", "cp737", "cp775", "cp850", "cp852", "cp855", "cp857", "cp858", "cp860", "cp861", "cp862", "cp863",
    "cp864", "cp865", "cp869", "mac_roman", "mac_latin2", "mac_iceland", "mac_turkish", "mac_greek", "mac_cyrillic",
}  # fmt: skip
_LANGUAGE_EVIDENCE = 0.3  # charset_normalizer coherence above which its language detection is trusted
_WESTERN_CHARS = frozenset(
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝŒœŠšŽžŸ€‚„…‘’“”•–—™«»°¡¿·§©®£¥¢½¼¾±×÷ªº\xa0"
)
_WORD = re.compile(r"[^\W\d_]+")
# A DOCX has a few dozen members; these bound what zipfile may list (checked from the end record).
MAX_ZIP_ENTRIES = 10_000
MAX_ZIP_DIRECTORY_BYTES = 2 << 20
_EOCD = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")


@dataclass(frozen=True, slots=True)
class Detection:
    """The kind of a file and, for text-like kinds, its decoded text."""

    kind: DocKind
    text: str | None = None
    encoding: str | None = None


def detect(data: bytes, name: str = "") -> DocKind:
    """The kind of document in `data`; raises UnsupportedFileType with the kind it saw otherwise."""
    return classify(data, name).kind


def classify(data: bytes, name: str = "") -> Detection:
    """Like `detect`, keeping the decoded text of text-like files so nobody decodes twice."""
    if not data:
        raise DocumentRejected("the file is empty")
    if _is_pdf(data):
        return Detection(DocKind.PDF)
    if data.startswith(_ZIP_MAGICS):
        return Detection(_zip_kind(data))
    if _is_image(data):
        return Detection(DocKind.IMAGE)
    if (binary := _binary_kind(data)) is not None:
        raise UnsupportedFileType(f"unsupported file type: {binary}", detected=binary)
    text, encoding = decode_text(data)
    return Detection(sniff_text_kind(text[:_HEAD], name), text, encoding)


def _is_pdf(data: bytes) -> bool:
    # Readers accept the header anywhere in the first KiB (some writers prepend junk); past byte 0 we
    # also want the end marker, so a text file that merely mentions "%PDF-" stays text.
    at = data.find(b"%PDF-", 0, 1024)
    return at == 0 or at > 0 and b"%%EOF" in data[-2048:]


def _is_image(data: bytes) -> bool:
    if data.startswith(_IMAGE_MAGICS) or data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return True
    # "BM" also starts ordinary sentences: a BMP has its pixel offset and header size where text has letters.
    return (
        data[:2] == b"BM" and len(data) > 26 and int.from_bytes(data[14:18], "little") in (12, 40, 52, 56, 64, 108, 124)
    )


def _binary_kind(data: bytes) -> str | None:
    for magic, kind in _SIGNATURES:
        if data.startswith(magic):
            if magic.isascii() and magic.isalnum() and not _looks_binary(data):
                continue  # "MZ", "BM", "GGUF"... are also how ordinary sentences can start
            return kind
    if data[4:8] == b"ftyp":
        return "ISO media (MP4/MOV/HEIC)"
    if data[:4] == b"RIFF" and data[8:12] in (b"WAVE", b"AVI "):
        return {b"WAVE": "WAV audio", b"AVI ": "AVI video"}[data[8:12]]
    if len(data) > 262 and data[257:262] == b"ustar":
        return "tar archive"
    if _looks_binary(data):
        return "binary data of an unknown type"
    return None


def _looks_binary(data: bytes) -> bool:
    if data.startswith(tuple(bom for bom, _ in _BOMS)):
        return False
    head = data[:8192]
    if b"\x00" in head:
        # UTF-16 without a BOM has NULs in every other byte of ASCII text; anything else is binary.
        return not _utf16_without_bom(head)
    # ESC and backspace belong to terminal output (colour codes, nroff's overstrike): the loaders strip them.
    controls = sum(1 for b in head if b < 32 and b not in (8, 9, 10, 12, 13, 27))
    return controls > len(head) * 0.05


def _utf16_without_bom(head: bytes) -> bool:
    even, odd = head[0::2], head[1::2]
    return even.count(0) > len(even) * 0.3 and odd.count(0) == 0 or odd.count(0) > len(odd) * 0.3 and even.count(0) == 0


def _zip_kind(data: bytes) -> DocKind:
    check_zip_directory(data)
    try:
        names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, struct.error) as exc:
        raise UnsupportedFileType(
            "unsupported file type: damaged ZIP archive", detected="ZIP archive (damaged)"
        ) from exc
    if "word/document.xml" in names and "[Content_Types].xml" in names:
        return DocKind.DOCX
    kind = _zip_flavour(data, names)
    raise UnsupportedFileType(f"unsupported file type: {kind}", detected=kind)


def check_zip_file(path: Path) -> None:
    """`check_zip_directory` on a file's tail, before anyone reads the whole file into memory."""
    with path.open("rb") as file:
        if not file.read(4).startswith(_ZIP_MAGICS):
            return
        size = file.seek(0, 2)
        base = max(0, size - _EOCD.size - 0xFFFF - _ZIP64_LOCATOR.size - _EOCD64.size)
        file.seek(base)
        tail = file.read()
    check_zip_directory(tail, base)


def check_zip_directory(data: bytes, base: int = 0) -> None:
    """Refuses a ZIP whose central directory is too big to list, from its end record alone.

    `zipfile` builds a ZipInfo per entry (~500 bytes each) before anyone can count them: a 47 MB
    directory of 900,000 entries cost the API 450 MB. The end-of-central-directory record states the
    entry count and the directory's size, and zipfile reads no more than that size, so checking them
    first bounds the listing. A record that cannot be found is left to zipfile to call damaged.
    """
    found = _zip_end_record(data, base)
    if found is None:
        return
    entries, directory_bytes = found
    if entries > MAX_ZIP_ENTRIES or directory_bytes > MAX_ZIP_DIRECTORY_BYTES:
        raise DocumentRejected(
            f"the ZIP archive lists {entries:,} entries in a {directory_bytes:,}-byte directory; a DOCX has a few "
            f"dozen (limits: {MAX_ZIP_ENTRIES:,} entries, {MAX_ZIP_DIRECTORY_BYTES:,} bytes)"
        )


def _zip_end_record(data: bytes, base: int = 0) -> tuple[int, int] | None:
    """(entries, directory bytes) from the end record, and from every ZIP64 record beside it.

    `zipfile` reads a ZIP64 record whenever its locator sits before the classic record, whatever the
    classic one says, from just before the locator; so we read the same place, and the place the locator
    points at, and keep the largest counts: a classic record saying "2 entries" cannot hide a ZIP64 one
    listing 900,000. `data` is the archive from offset `base` on.
    """
    at = len(data) - _EOCD.size
    if at < 0:
        return None
    if data[at : at + 4] != b"PK\x05\x06":
        at = data.rfind(b"PK\x05\x06", max(0, len(data) - _EOCD.size - 0xFFFF), at)
        if at < 0:
            return None
    record = data[at : at + _EOCD.size]
    if len(record) < _EOCD.size:
        return None
    _, _, _, _, entries, size, _, _ = _EOCD.unpack(record)
    locator_at = at - _ZIP64_LOCATOR.size
    locator = data[max(0, locator_at) : at]
    if locator[:4] == b"PK\x06\x07":
        _, _, offset, _ = _ZIP64_LOCATOR.unpack(locator)
        for start in (locator_at - _EOCD64.size, offset - base):  # where zipfile reads it; where it points
            record64 = data[start : start + _EOCD64.size] if start >= 0 else b""
            if len(record64) == _EOCD64.size and record64[:4] == b"PK\x06\x06":
                entries64, size64 = _EOCD64.unpack(record64)[7:9]
                entries, size = max(entries, entries64), max(size, size64)
    return entries, size


def _zip_flavour(data: bytes, names: set[str]) -> str:
    if "xl/workbook.xml" in names:
        return "XLSX spreadsheet"
    if "ppt/presentation.xml" in names:
        return "PPTX presentation"
    if "mimetype" in names:
        mimetype = data[38:90]
        if b"epub" in mimetype:
            return "EPUB book"
        if b"opendocument" in mimetype:
            return "OpenDocument file"
    if "META-INF/MANIFEST.MF" in names:
        return "Java archive (JAR)"
    return "ZIP archive (not a DOCX)"


def decode_text(data: bytes) -> tuple[str, str]:
    """(text, encoding) of bytes in any common encoding; raises UnsupportedFileType for binary data."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return _decode(data[len(bom) :], encoding.removesuffix("-sig"))
    head = data[:8192]
    if b"\x00" in head and _utf16_without_bom(head):
        return _decode(data, "utf-16-le" if head[1::2].count(0) > head[0::2].count(0) else "utf-16-be")
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    if (declared := _declared_charset(head)) is not None:
        try:
            return data.decode(declared), declared
        except UnicodeDecodeError:
            pass  # the declaration lies; let the statistics decide
    import charset_normalizer

    matches = charset_normalizer.from_bytes(data)
    best = matches.best()
    if best is None:
        raise UnsupportedFileType("unsupported file type: binary data of an unknown type", detected="binary data")
    # Single-byte code pages often tie (French text reads as well in cp1250 as in cp1252, with "à"
    # turned into "ŕ"); among equals, take the most widely used ones.
    ties = {m.encoding: m for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence)}
    best = next((ties[e] for e in _PREFERRED_ON_TIE if e in ties), best)
    if best.encoding not in _WESTERN_PAGES and (best.coherence < _LANGUAGE_EVIDENCE or best.encoding in _LEGACY_PAGES):
        western = _plausible_western(data)
        if western is not None:
            return western, "cp1252"
    return str(best), best.encoding


def _plausible_western(data: bytes) -> str | None:
    """The cp1252 reading of `data` when it reads as Western European text, else None.

    On short texts charset_normalizer has no language evidence and its pick among single-byte code
    pages is arbitrary (French "à" came out as cp1257 "ą", smart quotes as cp437 "ô"). cp1252 (a
    superset of Latin-1's printable range) is by far the most common of them, so it wins whenever its
    reading is plausible: only Western letters and punctuation beyond ASCII, no word made of non-ASCII
    letters alone (Cyrillic or Greek bytes read as cp1252 give such words), and at least half of the letters ASCII.
    """
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        return None
    if any(not ch.isascii() and ch not in _WESTERN_CHARS for ch in text):
        return None
    letters = [ch for ch in text if ch.isalpha()]
    foreign = sum(1 for ch in letters if not ch.isascii())
    if not letters or foreign > len(letters) // 2:
        return None
    if any(not any(ch.isascii() for ch in word) for word in _WORD.findall(text) if len(word) >= 3):
        return None
    return text


def _declared_charset(head: bytes) -> str | None:
    match = _CHARSET_DECL.search(head[:4096])
    if match is None:
        return None
    try:
        return codecs.lookup(match.group(1).decode("ascii")).name
    except (LookupError, UnicodeDecodeError):
        return None


def _decode(data: bytes, encoding: str) -> tuple[str, str]:
    try:
        return data.decode(encoding), encoding
    except UnicodeDecodeError as exc:
        raise DocumentRejected(f"the file looks like {encoding} text but does not decode as {encoding}") from exc


def sniff_text_kind(text: str, name: str = "") -> DocKind:
    """Markdown, HTML, a man page or plain text, from content signals first and the extension only as a tie-break."""
    ext = PurePath(name).suffix.lower()
    if _HTML_DOC.match(text):
        return DocKind.HTML
    if is_man_source(text):
        return DocKind.MAN
    has_tags = _HTML_TAGS.search(text) is not None
    if ext in _HTML_EXTS and has_tags:
        return DocKind.HTML
    if ext in _MD_EXTS:
        return DocKind.MARKDOWN
    if has_tags and text.lstrip().startswith("<") and ext not in {".txt", ".text"}:
        return DocKind.HTML
    if _MD_SIGNS.search(text):
        return DocKind.MARKDOWN
    return DocKind.TEXT


def is_man_source(text: str) -> bool:
    """A man page's troff source (man or mdoc macros), or a man page that links to another by `.so`."""
    if man_link(text) is not None:
        return True
    if not _TROFF_START.match(text):
        return False
    # The title within the first few hundred lines: pod2man and rst2man write macro definitions first.
    head = text[: 1 << 15].split("\n", _TITLE_WITHIN_LINES)[:_TITLE_WITHIN_LINES]
    return _TROFF_TITLE.search("\n".join(head)) is not None


def man_link(text: str) -> str | None:
    """The page a man page that is nothing but `.so man1/other.1` points to, else None."""
    match = _TROFF_LINK.match(text)
    return match.group(1) if match else None
