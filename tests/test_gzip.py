"""gzip files: decompressed within bounds and loaded by their inner type; hostile ones refused clearly."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator

import pytest

from ingest.loading import load_document
from ingest.models import DocKind
from ingest.sandbox import ParserPool
from rag.core.config import Settings
from rag.core.errors import DocumentRejected, UnsupportedFileType
from tests import hostile

CHANGELOG = (
    "libexample (4.19.0-3) unstable; urgency=medium\n\n"
    "  * Fix a crash when parsing an empty definitions file.\n"
    "  * Document asn1_parser2tree in the manual.\n\n"
    " -- A Maintainer <maint@example.org>  Sun, 01 Dec 2024 10:00:00 +0000\n"
)


@pytest.fixture(scope="module")
def pool() -> Iterator[ParserPool]:
    pool = ParserPool(memory_mb=512, max_workers=1)
    yield pool
    pool.close()


def load(data: bytes, name: str, pool: ParserPool, **settings: int) -> object:
    return load_document(data, name, Settings(parse_timeout_s=30, parse_memory_mb=512, **settings), pool=pool)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("changelog.Debian.gz", CHANGELOG),
        ("README.md.gz", "Usage\n\nRun update-mime-database after installing MIME files.\n"),  # .md: markdown
        ("notes.gz", "Usage\n\nRun update-mime-database after installing MIME files.\n"),
    ],
)
def test_a_gzip_file_loads_as_the_file_it_holds(name: str, text: str, pool: ParserPool):
    doc = load(gzip.compress(text.encode()), name, pool)
    plain = load(text.encode(), name.removesuffix(".gz"), pool)
    assert (doc.kind, doc.text) == (plain.kind, plain.text) and doc.text.strip()
    assert doc.name == name


def test_the_inner_name_decides_between_text_kinds(pool: ParserPool):
    text = b"Usage\n\nRun update-mime-database after installing MIME files.\n"
    assert load(gzip.compress(text), "README.md.gz", pool).kind is DocKind.MARKDOWN
    assert load(gzip.compress(text), "README.gz", pool).kind is DocKind.TEXT


def test_a_gzipped_pdf_is_parsed_as_a_pdf(pool: ParserPool):
    doc = load(gzip.compress(hostile.text_pdf(["The manual of the parser."])), "manual.pdf.gz", pool)
    assert doc.kind is DocKind.PDF and "manual of the parser" in doc.text


def test_concatenated_members_are_one_file(pool: ParserPool):
    doc = load(
        gzip.compress(b"First part of the notes. ") + gzip.compress(b"Second part of the notes."), "notes.gz", pool
    )
    assert "First part" in doc.text and "Second part" in doc.text


def test_a_gzip_bomb_stops_at_the_ratio_cap(pool: ParserPool):
    bomb = gzip.compress(b" " * (8 << 20))  # 8 MiB of blanks in ~8 KiB: about 1,000 to 1
    with pytest.raises(DocumentRejected, match="gzip bomb: it inflates more than 100 times"):
        load(bomb, "bomb.gz", pool)


def test_a_gzip_file_inflating_past_the_upload_limit_is_refused(pool: ParserPool):
    text = "".join(f"line {i}: {i * 7919 % 100003} honey jars\n" for i in range(200_000)).encode()  # ~6 MB, ratio ~5
    with pytest.raises(DocumentRejected, match="inflates past 1,048,576 bytes"):
        load(gzip.compress(text), "big.log.gz", pool, max_upload_bytes=1 << 20)


def test_a_gzip_inside_a_gzip_is_refused(pool: ParserPool):
    with pytest.raises(DocumentRejected, match="holds another gzip file inside"):
        load(gzip.compress(gzip.compress(CHANGELOG.encode())), "changelog.gz.gz", pool)


def test_a_truncated_gzip_file_is_refused(pool: ParserPool):
    packed = gzip.compress(CHANGELOG.encode() * 50)
    with pytest.raises(DocumentRejected, match="truncated gzip file"):
        load(packed[: len(packed) // 2], "changelog.gz", pool)


def test_a_corrupt_gzip_file_is_refused(pool: ParserPool):
    packed = bytearray(gzip.compress(CHANGELOG.encode() * 50))
    packed[20:40] = bytes(20)
    with pytest.raises(DocumentRejected, match="damaged gzip file"):
        load(bytes(packed), "changelog.gz", pool)


def test_an_unsupported_type_inside_says_it_is_inside(pool: ParserPool):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    with pytest.raises(UnsupportedFileType, match="tar archive inside the gzip file"):
        load(gzip.compress(buf.getvalue()), "bundle.tgz", pool)
