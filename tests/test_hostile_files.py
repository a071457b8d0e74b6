"""Hostile files, round two: every bound holds before the costly step, and no check can be sidestepped.

Each input is built here (see tests/hostile.py): a ZIP directory flood, XML in encodings expat cannot
read, a PDF of thousands of pages sharing one content stream, a document that makes too many chunks,
short Western European texts that the statistics alone would put in a rare code page.
"""

from __future__ import annotations

import io
import time
import tracemalloc
import zipfile

import pytest

from ingest import detect as detect_module
from ingest.chunking import Chunker
from ingest.detect import classify, decode_text
from ingest.loaders import parse
from ingest.loading import load_document
from ingest.models import DocKind
from ingest.sandbox import ParserPool
from rag.core.config import Settings
from rag.core.errors import DocumentRejected
from tests import hostile


@pytest.fixture(scope="module")
def pool():
    pool = ParserPool(memory_mb=512, max_workers=1)
    yield pool
    pool.close()


def test_a_zip_directory_flood_is_refused_from_the_end_record(monkeypatch: pytest.MonkeyPatch):
    data = hostile.zip_directory_flood(200_000)

    def listing(*args, **kwargs):
        raise AssertionError("zipfile listed the directory")

    monkeypatch.setattr(detect_module.zipfile, "ZipFile", listing)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(DocumentRejected) as info:
            classify(data, "flood.docx")
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "11,600,000-byte directory" in info.value.message
    assert peak < 1 << 20, f"refusing cost {peak:,} bytes"
    print(f"refused in {elapsed * 1000:.1f} ms")


def test_a_docx_under_the_zip_bounds_is_still_listed():
    assert classify(hostile.docx_document([("p", "fine")]), "ok.docx").kind is DocKind.DOCX
    with pytest.raises(Exception) as info:
        classify(hostile.zip_directory_flood(50), "small.zip")
    assert "not a DOCX" in str(info.value)


@pytest.mark.parametrize(
    ("encoding", "codec"), [("UTF-32", "utf-32"), ("UTF-32LE", "utf-32-le"), ("ebcdic-cp-us", "cp037")]
)
def test_xml_that_expat_cannot_read_is_refused_not_skipped(encoding: str, codec: str):
    data = hostile.docx_with_encoded_document_xml(encoding, codec)
    with pytest.raises(DocumentRejected) as info:
        parse(DocKind.DOCX, data, "encoded.docx")
    assert "word/document.xml" in info.value.message and "refused" in info.value.message


def test_utf16_xml_is_still_checked_and_its_dtd_refused():
    data = hostile.docx_with_encoded_document_xml("UTF-16", "utf-16")
    with pytest.raises(DocumentRejected) as info:
        parse(DocKind.DOCX, data, "utf16.docx")
    assert "DTD or entities" in info.value.message


@pytest.mark.parametrize(
    ("text", "encoding"),
    [
        ("Le musée ouvre à huit heures.", "latin-1"),
        ("ouvre à huit heures", "latin-1"),
        ("Ça coûte 5 €.", "cp1252"),
        ("Prix : 20 € la nuit.", "cp1252"),
        ("Tschüß!", "latin-1"),
        ("Grüße aus München, die Straße ist schön.", "latin-1"),
        ("Año nuevo", "latin-1"),
        ("¿Dónde está el niño?", "latin-1"),
        ("Não sei.", "latin-1"),
        ("Não há ação sem razão.", "latin-1"),
        ("\u201cBonjour\u201d, dit-il.", "cp1252"),
        ("He said \u201chello\u201d and \u2018bye\u2019 \u2014 it costs 5\u20ac.", "cp1252"),
    ],
)
def test_short_western_text_decodes_as_cp1252(text: str, encoding: str):
    assert decode_text(text.encode(encoding)) == (text, "cp1252")


@pytest.mark.parametrize(
    ("text", "encoding"),
    [
        ("Zażółć gęślą jaźń, powiedział Łukasz.", "cp1250"),
        ("Příliš žluťoučký kůň úpěl ďábelské ódy.", "cp1250"),
        ("Привет, как дела? Это простой текст.", "cp1251"),
        ("Καλημέρα, τι κάνεις σήμερα;", "cp1253"),
    ],
)
def test_other_code_pages_keep_their_reading(text: str, encoding: str):
    assert decode_text(text.encode(encoding))[0] == text


def test_a_pdf_of_thousands_of_shared_pages_is_refused_before_extraction(pool: ParserPool):
    data = hostile.shared_stream_pdf(6_000)
    assert len(data) < 1 << 20
    started = time.perf_counter()
    with pytest.raises(DocumentRejected) as info:
        load_document(data, "pages.pdf", Settings(parse_timeout_s=30, parse_memory_mb=512), pool=pool)
    assert "6,000 pages" in info.value.message and "RAG_MAX_DOCUMENT_PAGES" in info.value.message
    assert time.perf_counter() - started < 10
    doc = load_document(hostile.shared_stream_pdf(3), "three.pdf", Settings(max_document_pages=3), pool=pool)
    assert doc.pages == 3


def test_a_document_over_the_chunk_bound_stops_before_embedding():
    text = "\n\n".join(f"Paragraph {i}: " + "word " * 60 for i in range(200))
    doc = parse(DocKind.MARKDOWN, text.replace("Paragraph", "# Part").encode(), "long.md")
    chunker = Chunker(lambda s: len(s.split()), chunk_tokens=50, chunk_overlap=5, max_chunks=20)
    with pytest.raises(DocumentRejected) as info:
        chunker.chunk(doc, "d" * 64)
    assert "RAG_MAX_DOCUMENT_CHUNKS" in info.value.message
    assert len(Chunker(lambda s: len(s.split()), chunk_tokens=50, chunk_overlap=5).chunk(doc, "d" * 64)) > 20


def test_a_reused_worker_does_not_call_a_page_less_pdf_encrypted(pool: ParserPool):
    settings = Settings(parse_timeout_s=30, parse_memory_mb=512)
    with pytest.raises(DocumentRejected, match="encrypted"):
        load_document(hostile.encrypted_pdf(), "locked.pdf", settings, pool=pool)
    with pytest.raises(DocumentRejected) as info:
        load_document(hostile.PdfWriter().build(), "empty.pdf", settings, pool=pool)
    assert "encrypted" not in info.value.message and "password" not in info.value.message


def test_zipfile_is_the_real_one_again():
    assert detect_module.zipfile.ZipFile is zipfile.ZipFile


def test_a_zip64_record_behind_a_small_classic_record_is_read(tmp_path):
    from ingest.detect import check_zip_file

    data = hostile.zip_directory_flood(70_000, shared_header=True, zip64_behind_small_record=True)
    assert len(zipfile.ZipFile(io.BytesIO(data)).infolist()) == 70_000  # what zipfile would list
    with pytest.raises(DocumentRejected, match="70,000 entries"):
        classify(data, "hidden.docx")
    path = tmp_path / "hidden.docx"
    path.write_bytes(data)
    with pytest.raises(DocumentRejected, match="70,000 entries"):
        check_zip_file(path)


def test_a_zip_directory_flood_on_disk_is_refused_from_its_tail(tmp_path):
    from ingest.detect import check_zip_file

    path = tmp_path / "flood.docx"
    path.write_bytes(hostile.zip_directory_flood(200_000, shared_header=True))
    tracemalloc.start()
    try:
        with pytest.raises(DocumentRejected):
            check_zip_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    ok = tmp_path / "ok.docx"
    ok.write_bytes(hostile.docx_document([("p", "fine")]))
    check_zip_file(ok)


def test_a_main_part_hidden_in_word_media_is_checked_like_any_other():
    src = zipfile.ZipFile(io.BytesIO(hostile.docx_document([("p", "placeholder")])))
    moved = {
        "word/document.xml": "word/media/main.xml",
        "word/_rels/document.xml.rels": "word/media/_rels/main.xml.rels",
    }
    entity = '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY e "expanded">]>' + hostile._BODY.format(
        text="Visible words &e;"
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename in ("_rels/.rels", "[Content_Types].xml"):
                data = data.replace(b"word/document.xml", b"word/media/main.xml")
            if info.filename == "word/document.xml":
                data = entity.encode()
            if info.filename == "word/_rels/document.xml.rels":  # its targets are relative to the part
                data = data.replace(b'Target="', b'Target="../').replace(b'Target="../http', b'Target="http')
            dst.writestr(moved.get(info.filename, info.filename), data)
    with pytest.raises(DocumentRejected) as info:
        parse(DocKind.DOCX, out.getvalue(), "hidden-main.docx")
    assert "word/media/main.xml" in info.value.message
