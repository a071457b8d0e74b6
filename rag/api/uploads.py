"""Receiving uploads: a multipart body streamed to disk under a size limit, and safe names for its files.

The body is parsed as it arrives (python-multipart's streaming parser over `request.stream()`), so the
limit holds while reading: the first byte over it ends the upload with 413, whatever Content-Length
said. Files land in a directory of the caller's, which the caller removes on every outcome.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect

from rag.core.errors import FileTooLarge, InvalidRequest, UnsupportedFileType

FILE_FIELDS = ("files", "file")
MAX_FIELD_BYTES = 64 * 1024
MAX_PARTS = 1000
FORM_OVERHEAD = 256 * 1024  # part headers and form fields beside the files' bytes
MAX_NAME_CHARS = 255
MAX_SOURCE_CHARS = 4096


@dataclass
class ReceivedFile:
    path: Path
    filename: bytes  # as the client sent it
    size: int = 0


@dataclass
class ReceivedForm:
    files: list[ReceivedFile] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)

    def field(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else None


def multipart_boundary(content_type: str | None) -> bytes:
    """The boundary of a multipart/form-data body; 415 for any other body."""
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        shown = (content_type or "none").split(";")[0][:100]
        raise UnsupportedFileType(
            f"send files as multipart/form-data (field 'files'); the request's Content-Type is {shown}"
        )
    return options[b"boundary"]


class _Receiver:
    """python-multipart callbacks that write file parts to disk and keep small form fields."""

    def __init__(self, directory: Path, limit: int) -> None:
        self.directory = directory
        self.limit = limit
        self.form = ReceivedForm()
        self.file_bytes = 0
        self._headers: dict[bytes, bytes] = {}
        self._header_field = b""
        self._header_value = b""
        self._sink: BinaryIO | None = None
        self._field: tuple[str, bytearray] | None = None
        self._parts = 0
        self.complete = False  # the closing boundary was seen

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._add_header_field(data[start:end]),
            "on_header_value": lambda data, start, end: self._add_header_value(data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": lambda data, start, end: self._data(data[start:end]),
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise InvalidRequest(f"more than {MAX_PARTS} parts in one upload")
        self._headers = {}

    def _add_header_field(self, data: bytes) -> None:
        self._header_field += data

    def _add_header_value(self, data: bytes) -> None:
        self._header_value += data

    def _header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field = self._header_value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b"").decode("latin-1"))
        name = options.get(b"name", b"").decode("latin-1")
        if b"filename" in options:
            if name not in FILE_FIELDS:
                raise InvalidRequest(f"files go in the multipart field 'files', not {name[:50]!r}")
            received = ReceivedFile(self.directory / f"part-{len(self.form.files):05d}", options[b"filename"])
            self.form.files.append(received)
            self._sink = received.path.open("wb")
        else:
            self._field = (name, bytearray())

    def _data(self, data: bytes) -> None:
        if self._sink is not None:
            self.file_bytes += len(data)
            if self.file_bytes > self.limit:
                raise FileTooLarge(
                    f"the upload is over the limit of {self.limit:,} bytes (RAG_MAX_UPLOAD_BYTES)", limit=self.limit
                )
            self.form.files[-1].size += len(data)
            self._sink.write(data)
        elif self._field is not None:
            self._field[1].extend(data)
            if len(self._field[1]) > MAX_FIELD_BYTES:
                raise InvalidRequest(f"form field {self._field[0][:50]!r} is over {MAX_FIELD_BYTES:,} bytes")

    def _part_end(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        elif self._field is not None:
            name, value = self._field
            try:
                self.form.fields.setdefault(name, []).append(value.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidRequest(f"form field {name[:50]!r} is not UTF-8") from None
            self._field = None

    def _end(self) -> None:
        self.complete = True

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()


async def receive_multipart(
    chunks: AsyncIterator[bytes], content_type: str | None, content_length: str | None, directory: Path, limit: int
) -> ReceivedForm:
    """Stream a multipart body into `directory`; at most `limit` bytes of files in all."""
    boundary = multipart_boundary(content_type)
    body_limit = limit + FORM_OVERHEAD
    if content_length and content_length.isdigit() and int(content_length) > body_limit:
        raise FileTooLarge(f"the upload is over the limit of {limit:,} bytes (RAG_MAX_UPLOAD_BYTES)", limit=limit)
    receiver = _Receiver(directory, limit)
    parser = MultipartParser(boundary, receiver.callbacks())  # type: ignore[arg-type]
    received = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > body_limit:
                raise FileTooLarge(
                    f"the upload is over the limit of {limit:,} bytes (RAG_MAX_UPLOAD_BYTES)", limit=limit
                )
            parser.write(chunk)
        parser.finalize()
        _check_complete(receiver, received, content_length)
    except MultipartParseError as exc:
        raise InvalidRequest(f"malformed multipart body: {exc}") from None
    except ClientDisconnect:
        raise InvalidRequest("the upload was interrupted: the client went away") from None
    finally:
        receiver.close()
    if not receiver.form.files:
        raise InvalidRequest("no files: send them in the multipart field 'files'")
    return receiver.form


def _check_complete(receiver: _Receiver, received: int, content_length: str | None) -> None:
    """A body cut short (before its closing boundary, or under its Content-Length) is refused whole: the
    parser would otherwise hand over the last file's first bytes as if they were all of it."""
    if content_length and content_length.isdigit() and received < int(content_length):
        raise InvalidRequest(
            f"the upload was cut short: {received:,} of {int(content_length):,} bytes (Content-Length) arrived"
        )
    if not receiver.complete:
        raise InvalidRequest("the upload was cut short: the multipart body ends before its closing boundary")


# Names.


def _unsafe_char(ch: str) -> bool:
    # Controls, format characters (bidi overrides, zero-width), surrogates, private use, unassigned,
    # line and paragraph separators.
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def escape_name(name: str) -> str:
    """A printable rendering of any name: unsafe characters and stray bytes as \\xNN / \\uNNNN escapes."""
    out = []
    for ch in name:
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte that was not UTF-8 (decoded with surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif _unsafe_char(ch):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= 1024 else text[:1023] + "…"


def safe_filename(raw: bytes) -> str | None:
    """The name itself when it is a plain file name; None when it must not be used as one."""
    try:
        name = unicodedata.normalize("NFC", raw.decode("utf-8"))  # "résumé" typed on macOS or Linux: one name
    except UnicodeDecodeError:
        return None
    if (
        not name.strip()
        or name in (".", "..")
        or len(name) > MAX_NAME_CHARS
        or "/" in name
        or "\\" in name
        or any(_unsafe_char(ch) for ch in name)
    ):
        return None
    return name


def upload_names(raw: bytes) -> tuple[str, str]:
    """(source, display name) of an uploaded file.

    A plain name is both. A name that carries a path, NUL or other control characters, invalid UTF-8 or
    255+ characters is stored under a server id derived from it (so a new upload under the same name
    still replaces the old one), and shown escaped.
    """
    name = safe_filename(raw)
    if name is not None:
        return name, name
    server_id = "upload-" + hashlib.sha256(raw).hexdigest()[:16]
    shown = escape_name(raw.decode("utf-8", errors="surrogateescape")) or server_id
    return server_id, shown


def check_source(source: str) -> str:
    """A client-given source key (the CLI sends a file's path): printable and of sane length."""
    if not source or len(source) > MAX_SOURCE_CHARS or any(_unsafe_char(ch) for ch in source):
        raise InvalidRequest("each 'sources' value must be 1-4096 printable characters")
    return unicodedata.normalize("NFC", source)
