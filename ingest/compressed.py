"""gzip files (`README.Debian.gz`, `changelog.gz`): decompressed within bounds, then loaded by their inner type.

The output is produced in steps and counted as it comes, so a gzip bomb stops at a cap instead of
filling memory: at most `max_bytes` in all (the loader passes RAG_MAX_UPLOAD_BYTES: a file may inflate
to what could have been uploaded as is), and, past the first MiB, at most `MAX_RATIO` times the
compressed size (the 2,269 gzip files of a Debian /usr/share/doc inflate at most 28 times; a bomb, over
1,000 times). A gzip inside a gzip is refused (nothing writes one on purpose; bombs nest), and so is a
truncated or corrupt stream. Concatenated members (what `cat a.gz b.gz` gives) are read as one file.
zlib is used directly rather than the gzip module, whose `decompress` has no output bound.
"""

from __future__ import annotations

import zlib
from pathlib import PurePath

from rag.core.errors import DocumentRejected

GZIP_MAGIC = b"\x1f\x8b"
MAX_RATIO = 100
RATIO_FREE_BYTES = 1 << 20  # output under this size may have any ratio (a page of blanks compresses 1000:1)
_STEP = 1 << 20  # bytes of output per decompression step


def is_gzip(data: bytes) -> bool:
    return data.startswith(GZIP_MAGIC)


def inner_name(name: str) -> str:
    """The name of what a gzip file holds: `changelog.gz` -> `changelog`, `notes.tgz` -> `notes.tar`."""
    path = PurePath(name)
    if path.suffix.lower() == ".gz":
        return str(path.with_suffix(""))
    if path.suffix.lower() == ".tgz":
        return str(path.with_suffix(".tar"))
    return name


def gunzip(data: bytes, name: str, max_bytes: int) -> bytes:
    """The decompressed bytes of a gzip file; DocumentRejected for a bomb, a nested gzip or a broken stream."""
    out = bytearray()
    pending = memoryview(data)
    while pending:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # 16 +: the gzip header and trailer
        while True:
            try:
                piece = inflater.decompress(pending, _STEP)
            except zlib.error as exc:
                raise DocumentRejected(f"{name} is a damaged gzip file ({exc})") from exc
            out += piece
            _check_size(out, len(data), name, max_bytes)
            pending = memoryview(inflater.unconsumed_tail)
            if inflater.eof or not piece and not pending:
                break
        if not inflater.eof:
            raise DocumentRejected(f"{name} is a truncated gzip file: it ends before its end marker")
        pending = memoryview(inflater.unused_data)
        if pending and not bytes(pending[:2]) == GZIP_MAGIC:
            break  # trailing padding after the last member, as some tools write: ignored like gzip does
    if is_gzip(bytes(out[:4])):
        raise DocumentRejected(f"{name} holds another gzip file inside; decompress it first")
    if not out:
        raise DocumentRejected(f"{name} is an empty gzip file")
    return bytes(out)


def _check_size(out: bytearray, packed: int, name: str, max_bytes: int) -> None:
    if len(out) > max_bytes:
        raise DocumentRejected(f"{name} inflates past {max_bytes:,} bytes (RAG_MAX_UPLOAD_BYTES): too big to index")
    if len(out) > RATIO_FREE_BYTES and len(out) > MAX_RATIO * packed:
        raise DocumentRejected(f"{name} is a gzip bomb: it inflates more than {MAX_RATIO} times its {packed:,} bytes")
