"""Loading: type detection, decoding, each format's structure, and every hostile file we know of."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from ingest.detect import classify, detect
from ingest.loading import load_document
from ingest.models import DocKind, LoadedDocument
from ingest.sandbox import ParserPool
from rag.core.config import Settings
from rag.core.errors import DocumentRejected, UnsupportedFileType
from tests import css_hiding, hostile
from tests.data import CMRC


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(parse_timeout_s=30, parse_memory_mb=512)


@pytest.fixture(scope="module")
def pool() -> ParserPool:
    pool = ParserPool(memory_mb=512, max_workers=1)
    yield pool
    pool.close()


@pytest.fixture
def load(settings: Settings, pool: ParserPool):
    def load(data: bytes, name: str) -> LoadedDocument:
        return load_document(data, name, settings, pool=pool)

    return load


def assert_offsets(doc: LoadedDocument) -> None:
    for section in doc.sections:
        assert doc.text[section.start : section.end] == section.text
        assert section.text.strip() == section.text != ""


def cmrc_context(index: int = 0) -> str:
    data = json.loads(CMRC.read_text(encoding="utf-8"))
    return [p["context"] for a in data["data"] for p in a["paragraphs"]][index]


# --- detection ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "name", "seen"),
    [
        (hostile.elf_executable(), "report.pdf", "ELF executable"),
        (b"GIF89a" + bytes(100), "notes.txt", "GIF image"),
        (b"PK\x05\x06" + bytes(18), "file.docx", "ZIP archive (not a DOCX)"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504), "old.doc", "OLE2 compound file"),
        (b"BZh91AY&SY" + bytes(100), "a.md", "bzip2 archive"),
        (bytes(range(256)) * 4, "data.txt", "binary data of an unknown type"),
    ],
)
def test_unsupported_types_are_named_from_the_bytes(data: bytes, name: str, seen: str, load) -> None:
    with pytest.raises(UnsupportedFileType) as info:
        load(data, name)
    assert seen in info.value.message
    assert info.value.status == 415
    assert seen in info.value.detail["detected"]


def test_zip_flavours_are_named() -> None:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(UnsupportedFileType, match="XLSX spreadsheet"):
        detect(buf.getvalue(), "sheet.docx")


@pytest.mark.parametrize(
    ("data", "name", "kind"),
    [
        (hostile.text_pdf(["x"]), "no-extension", DocKind.PDF),
        (hostile.docx_document([("p", "x")]), "file.pdf", DocKind.DOCX),
        (b"just words", "notes.md", DocKind.MARKDOWN),  # the extension breaks the tie
        (b"just words", "notes.txt", DocKind.TEXT),
        (b"# A heading\n\nwords", "notes.txt", DocKind.MARKDOWN),  # content wins over .txt
        (b"<!DOCTYPE html><html><body><p>x</p></body></html>", "page.txt", DocKind.HTML),
        (b"<div><p>x</p></div>", "upload", DocKind.HTML),
        (b"<p>x</p> inline tags in a note", "note.txt", DocKind.TEXT),
        (b"GGUF is a file format", "a.txt", DocKind.TEXT),  # a signature is not a word
        (b"MZ reads like a word here", "a.txt", DocKind.TEXT),
    ],
)
def test_kind_comes_from_content(data: bytes, name: str, kind: DocKind) -> None:
    assert detect(data, name) is kind


# --- empty and undecodable ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (b"", "empty.txt"),
        (b"   \n\t\r\n  ", "blank.txt"),
        ("\u3000\n ".encode(), "blank.md"),
        (b"<html><body> </body></html>", "a.html"),
        ("\ufeff\u00a0\u2003\u200b\n\u2009\u200b\u2060\u202f".encode(), "unicode-blank.txt"),
        ("<html><body><p>\u200b\u00a0</p></body></html>".encode(), "zero-width.html"),
    ],
)
def test_empty_and_whitespace_only_are_rejected(data: bytes, name: str, load) -> None:
    with pytest.raises(DocumentRejected) as info:
        load(data, name)
    assert info.value.status == 422


# Text a reader sees nothing of, though it is not whitespace: refused like an empty file.
INVISIBLE = {
    "tag characters": "".join(chr(c) for c in range(0xE0020, 0xE0080)) * 3,
    "Hangul fillers": "\u3164\uffa0\u115f\u1160\n" * 50,
    "Braille blank": "\u2800" * 400,
    "variation selectors": "\ufe00\ufe0f\U000e0100\U000e01ef\u180b" * 80,
    "combining marks alone": "\u0301\u0308\u20dd\u0489 " * 100,
    "ideographic space and half fill space": "\u3000\u303f\n" * 100,
    "all of them with zero-width joiners": "\u200d\U000e0041\u3164\u2800\ufe0f\u0301\u3000\u303f\u2060" * 50,
}


@pytest.mark.parametrize("text", list(INVISIBLE.values()), ids=list(INVISIBLE))
@pytest.mark.parametrize("suffix", [".txt", ".md", ".html"])
def test_text_without_a_visible_character_is_rejected(text: str, suffix: str, load) -> None:
    data = f"<html><body><p>{text}</p></body></html>" if suffix == ".html" else text
    with pytest.raises(DocumentRejected, match="no text to index") as info:
        load(data.encode(), f"invisible{suffix}")
    assert info.value.status == 422


def test_invisible_characters_beside_visible_text_are_kept(load) -> None:
    doc = load("Caf\u0065\u0301 \u3164 menu \u2800 \U0001f600\ufe0f \u2764\n".encode(), "menu.txt")
    assert "menu" in doc.text and "\u0301" in doc.text and len(doc.sections) == 1


def test_whitespace_only_pdf_page_text_is_rejected(load) -> None:
    with pytest.raises(DocumentRejected, match="no extractable text"):
        load(hostile.text_pdf(["   "]), "blank.pdf")


# --- text encodings -------------------------------------------------------------------------------

SAMPLE = "Grüße aus Köln — naïve café, 東京 and 北京.\nSecond line."


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be"])
def test_unicode_encodings_decode(encoding: str, load) -> None:
    data = SAMPLE.encode(encoding)
    if encoding in ("utf-16-le", "utf-16-be"):
        data = (b"\xff\xfe" if encoding.endswith("le") else b"\xfe\xff") + data
    doc = load(data, "sample.txt")
    assert doc.text == SAMPLE
    assert doc.kind is DocKind.TEXT


def test_gbk_chinese_decodes(load) -> None:
    text = cmrc_context(1)
    doc = load(text.encode("gbk"), "news.txt")
    assert doc.text == text
    assert doc.encoding in ("gb18030", "gbk", "gb2312")


def test_latin1_decodes(load) -> None:
    text = "Le cœur a ses raisons que la raison ne connaît point. Ça, c'est la vérité d'un été à Montréal.\n" * 3
    doc = load(text.replace("œ", "oe").encode("latin-1"), "fr.txt")
    assert doc.text == text.replace("œ", "oe")


def test_crlf_is_normalised(load) -> None:
    doc = load(b"one\r\ntwo\rthree", "a.txt")
    assert doc.text == "one\ntwo\nthree"


def test_html_meta_charset_is_honoured() -> None:
    page = '<html><head><meta charset="gbk"></head><body><p>中文网页的正文。</p></body></html>'
    assert classify(page.encode("gbk"), "a.html").text == page


# --- markdown -------------------------------------------------------------------------------------


def test_markdown_heading_paths(load) -> None:
    source = (
        "# Guide\n\nIntro text.\n\n## Install\n\nRun the script.\n\n```\n# not a heading\n```\n\n"
        "### On Linux\n\nUse apt.\n\n## Use\nSetext title\n------------\n\nMore.\n"
    )
    doc = load(source.encode(), "guide.md")
    assert doc.text == source
    assert doc.title == "Guide"
    paths = [s.headings for s in doc.sections]
    assert paths == [("Guide",), ("Guide", "Install"), ("Guide", "Install", "On Linux"), ("Guide", "Setext title")]
    assert "# not a heading" in doc.sections[1].text
    assert doc.sections[3].text.startswith("## Use")  # a heading without body joins the next section
    assert_offsets(doc)


# --- HTML -----------------------------------------------------------------------------------------


def test_html_keeps_main_text_and_drops_the_rest(load, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[object] = []

    def no_network(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise AssertionError("the HTML loader tried to open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)

    doc = load(hostile.html_with_scripts_and_remote_resources(), "notes.html")

    assert attempts == []
    assert doc.kind is DocKind.HTML
    assert doc.title == "Field notes"
    assert "Herons stand still" in doc.text and "Shallow water at dawn" in doc.text
    for absent in (
        hostile.HTML_SECRET_SCRIPT, "fetch(", "late script", "background", "198.51.100.7", "Menu entry", "About us",
        "Copyright footer", "Hidden by", "Hidden from readers", "enable JavaScript", "Template text",
    ):  # fmt: skip
        assert absent not in doc.text, absent
    assert [s.headings for s in doc.sections] == [("Observing herons",), ("Observing herons", "Where to look")]
    assert_offsets(doc)


def test_html_structure_lists_tables_and_breaks(load) -> None:
    page = (
        b"<html><body><nav>menu</nav><article><header><h1>Title</h1></header><p>a<br>b</p>"
        b"<ul><li>one</li><li>two</li></ul><table><tr><th>k</th><th>v</th></tr><tr><td>1</td><td>2</td></tr></table>"
        b"<h2>Sub</h2><p>x  \n  y</p></article></body></html>"
    )
    doc = load(page, "p.html")
    assert doc.text == "Title\n\na\nb\n\none\ntwo\n\n| k | v |\n| --- | --- |\n| 1 | 2 |\n\nSub\n\nx y"
    assert [s.headings for s in doc.sections] == [("Title",), ("Title",), ("Title", "Sub")]
    assert doc.sections[1].table_header == "| k | v |\n| --- | --- |"


def test_deeply_nested_html_does_not_recurse(load) -> None:
    depth = 20_000
    page = ("<div>" * depth + "deep text" + "</div>" * depth).encode()
    assert "deep text" in load(page, "deep.html").text


def test_large_html_is_read_whole(load) -> None:
    body = "".join(f"<p>Paragraph {i} of a long page.</p>" for i in range(12_000))
    page = f"<html><body><h1>Long</h1>{body}</body></html>".encode()
    assert len(page) > 256 * 1024
    doc = load(page, "long.html")
    assert doc.text.count("of a long page.") == 12_000


def test_html_drops_navigation_blocks_and_furniture_but_keeps_cross_references(load) -> None:
    page = b"""<html><body>
<div class="header"><p>Next: <a href="s.html">Simple Example</a>, Up: <a href="u.html">Using libffi</a>
 [<a href="i.html">Index</a>]</p></div>
<div class="section"><h3>2.1 The Basics</h3>
<p>libffi assumes that you have a pointer to the function. See <a href="t.html">Types</a>.</p>
<ul class="mini-toc"><li><a href="a.html">Arrays</a></li><li><a href="b.html">Unions</a></li></ul>
<p>Function: ffi_status ffi_prep_cif (ffi_cif *cif)</p>
<p>message <a href="#s">&lt;string&gt;</a> | <a href="#e">&lt;Error&gt;</a></p>
<p>Next: <a href="s.html">Simple Example</a>, Up: <a href="u.html">Using libffi</a></p>
</div><div id="sidebar">Popular posts this week</div></body></html>"""
    doc = load(page, "basics.html")
    assert doc.text == (
        "2.1 The Basics\n\nlibffi assumes that you have a pointer to the function. See Types.\n\n"
        "Function: ffi_status ffi_prep_cif (ffi_cif *cif)\n\nmessage <string> | <Error>"
    )
    assert [s.headings for s in doc.sections] == [("2.1 The Basics",)]


def test_html_drops_text_hidden_by_css_tricks(load) -> None:
    page = b"""<html><head><style>.promo, #trap { display: none } .big { font-size: 2em }</style></head>
<body><p>Visible one.</p>
<p style="font-size:0">Tiny secret.</p><p style="color:#fff">White on white.</p>
<p style="color: white; background: black">White on black stays.</p>
<div style="background-color:#000"><span style="color:#000000">Black on black.</span></div>
<p style="position:absolute; left:-9999px">Off screen.</p><p style="text-indent:-5000px">Indented away.</p>
<p class="hidden">Class hidden.</p><span class="sr-only">Screen reader only.</span>
<p class="promo">Hidden by the page's style.</p><p id="trap">Hidden by id.</p><p class="big">Big stays.</p>
<p style="opacity: 0">Transparent.</p><p style="opacity: 0.5">Half stays.</p>
<font color="white">Font white.</font></body></html>"""
    text = load(page, "tricks.html").text
    assert text.split("\n\n") == ["Visible one.", "White on black stays.", "Big stays.", "Half stays."]


def test_html_drops_text_hidden_by_every_css_technique_and_keeps_look_alikes(load) -> None:
    hidden = load(css_hiding.page(css_hiding.HIDING, "HIDDEN"), "hiding.html").text
    assert [name for i, (name, _, _) in enumerate(css_hiding.HIDING) if f"HIDDEN{i} " in hidden] == []
    assert hidden == "Visible intro."
    shown = load(css_hiding.page(css_hiding.SHOWN, "SHOWN"), "shown.html").text
    assert [name for i, (name, _, _) in enumerate(css_hiding.SHOWN) if f"SHOWN{i} " not in shown] == []


@pytest.mark.parametrize("name", ["manual.txt", "manual.md", "page.html"])
def test_terminal_escapes_and_control_characters_are_stripped_in_every_format(load, name: str) -> None:
    raw = "The \x1b[1mGNU \x1b[22mROFF (\x1b[1mGROFF\x1b[22m) suite, b\x08bo\x08ol\x08ld, \x1b]0;t\x07end\x07."
    data = f"<html><body><p>{raw}</p></body></html>" if name.endswith(".html") else raw + "\n"
    text = load(data.encode(), name).text
    assert text.strip() == "The GNU ROFF (GROFF) suite, bold, end."


# --- PDF ------------------------------------------------------------------------------------------


def test_pdf_pages_are_numbered(load) -> None:
    data = hostile.text_pdf([["First page, line one", "line two"], [], ["Third page (with parentheses)"]])
    doc = load(data, "three.pdf")
    assert doc.kind is DocKind.PDF and doc.pages == 3
    assert [(s.page, s.text) for s in doc.sections] == [
        (1, "First page, line one\nline two"),
        (3, "Third page (with parentheses)"),
    ]
    assert_offsets(doc)


def test_encrypted_pdf_is_rejected(load) -> None:
    with pytest.raises(DocumentRejected, match="encrypted"):
        load(hostile.encrypted_pdf(), "locked.pdf")


def test_encrypted_pdf_fixture_is_real() -> None:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(hostile.encrypted_pdf("Secret numbers", user_password="pw"), password="pw")
    assert pdf[0].get_textpage().get_text_range() == "Secret numbers"


def test_image_only_pdf_is_rejected(load) -> None:
    with pytest.raises(DocumentRejected, match="no extractable text"):
        load(hostile.image_only_pdf(), "scan.pdf")


def test_circular_xref_pdf_loads_once(load) -> None:
    doc = load(hostile.circular_xref_pdf("Behind a loop"), "loop.pdf")
    assert doc.text == "Behind a loop"


def test_page_tree_loop_pdf_loads_once(load) -> None:
    doc = load(hostile.page_tree_loop_pdf("Only once"), "tree.pdf")
    assert doc.text == "Only once"


def test_pdf_outline_gives_heading_paths(load) -> None:
    data = hostile.text_pdf(
        ["Preface text", "Chapter one text", "More of chapter one"], outline=[("Preface", 0), ("Chapter 1", 1)]
    )
    doc = load(data, "book.pdf")
    assert [(s.page, s.headings) for s in doc.sections] == [(1, ("Preface",)), (2, ("Chapter 1",)), (3, ("Chapter 1",))]
    assert_offsets(doc)


def test_garbage_after_pdf_header_is_rejected(load) -> None:
    with pytest.raises(DocumentRejected, match="not a readable PDF"):
        load(b"%PDF-1.7\n" + bytes(range(256)) * 8, "broken.pdf")


def test_flate_bomb_pdf_is_stopped_and_the_pool_recovers(load) -> None:
    data = hostile.flate_bomb_pdf(inflated_bytes=4 << 30, layers=3)
    assert len(data) < 10_000
    with pytest.raises(DocumentRejected, match="512 MB memory limit"):
        load(data, "bomb.pdf")
    assert load(hostile.text_pdf(["after the bomb"]), "ok.pdf").text == "after the bomb"


def test_parse_timeout_kills_the_worker(pool: ParserPool) -> None:
    slow = hostile.text_pdf([[f"page {i} line {j}" for j in range(40)] for i in range(500)])
    started = time.monotonic()
    with pytest.raises(DocumentRejected, match="within 0.05 s"):
        pool.parse(DocKind.PDF, slow, "slow.pdf", timeout_s=0.05)
    assert time.monotonic() - started < 5
    assert pool.parse(DocKind.PDF, hostile.text_pdf(["fine"]), "ok.pdf", timeout_s=30).text == "fine"


# --- DOCX -----------------------------------------------------------------------------------------


def test_docx_headings_paragraphs_and_tables(load) -> None:
    data = hostile.docx_document(
        [
            ("title", "Annual report"),
            ("heading1", "Summary"),
            ("p", "Revenue grew."),
            ("heading2", "By region"),
            ("table", [["Region", "Revenue"], ["North", "10"], ["South", "12"]]),
            ("heading1", "Outlook"),
            ("p", "Steady."),
        ]
    )
    doc = load(data, "report.docx")
    assert doc.kind is DocKind.DOCX
    assert [s.headings for s in doc.sections] == [
        ("Annual report", "Summary"),
        ("Annual report", "Summary", "By region"),
        ("Annual report", "Outlook"),
    ]
    assert doc.sections[1].text == "By region\n\n| Region | Revenue |\n| --- | --- |\n| North | 10 |\n| South | 12 |"
    assert doc.sections[1].table_header == "By region\n\n| Region | Revenue |\n| --- | --- |"
    assert_offsets(doc)


@pytest.mark.parametrize("lying", [False, True], ids=["honest-directory", "lying-directory"])
def test_docx_zip_bomb_is_rejected(lying: bool, load) -> None:
    data = hostile.docx_zip_bomb(inflated_bytes=2 << 30, lying_directory=lying)
    assert len(data) < 5_000_000
    with pytest.raises(DocumentRejected, match="zip bomb|inflate to"):
        load(data, "bomb.docx")


def test_docx_bomb_under_the_stated_size_is_caught_while_inflating() -> None:
    from ingest.loaders.docx import check_archive

    # Directory says 100 MB (under a 200 MB cap) and the member really inflates to 300 MB.
    data = hostile.docx_zip_bomb(inflated_bytes=300 << 20)
    patched = data.replace((300 << 20).to_bytes(4, "little"), (100 << 20).to_bytes(4, "little"))
    with pytest.raises(DocumentRejected, match="inflates past the 104,857,600 bytes"):
        check_archive(patched, "bomb.docx", max_inflated=200 << 20)


@pytest.mark.parametrize(
    "builder", [hostile.docx_with_doctype, hostile.docx_with_external_entity, hostile.docx_billion_laughs]
)
def test_docx_dtd_and_entities_are_refused(builder, load) -> None:
    with pytest.raises(DocumentRejected, match="DTD or entities"):
        load(builder(), "evil.docx")


# --- Chinese end to end ---------------------------------------------------------------------------


def test_cmrc_chinese_document_loads(load) -> None:
    text = "\n\n".join(cmrc_context(i) for i in range(4))
    for data in (text.encode("utf-8"), text.encode("gb18030")):
        doc = load(data, "cmrc.txt")
        assert doc.text == text
        assert_offsets(doc)


# --- the parser worker ----------------------------------------------------------------------------


def test_worker_is_lean_and_limited() -> None:
    pool = ParserPool(memory_mb=300, max_workers=1)
    try:
        pool.warm()
        pid = pool._idle[0].process.pid
        limits = Path(f"/proc/{pid}/limits").read_text()
        address_space = next(line for line in limits.splitlines() if line.startswith("Max address space"))
        assert address_space.split()[3] == str(300 << 20)
        maps = Path(f"/proc/{pid}/maps").read_text()
        for heavy in ("torch", "chromadb", "onnxruntime", "fastapi"):
            assert heavy not in maps, heavy
    finally:
        pool.close()


def test_workers_serve_concurrent_callers(settings: Settings) -> None:
    """Two documents are in the two workers at once (each scanned page waits in OCR for the other's), and
    never three."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from ingest.loaders.ocr import OcrLine, PageLines

    both_in = threading.Barrier(2, timeout=60)  # broken, and the parse fails, if the pool serves one at a time
    in_ocr, most = 0, 0
    lock = threading.Lock()

    def ocr_of(n: int):
        def ocr(image: object) -> PageLines:
            nonlocal in_ocr, most
            with lock:
                in_ocr += 1
                most = max(most, in_ocr)
            both_in.wait()
            with lock:
                in_ocr -= 1
            return PageLines([OcrLine(f"document {n}", 0.1, 0.1, 0.5, 0.12, 0.99)])

        return ocr

    others = set(_parser_workers())  # the other pools' of this test run
    pool = ParserPool(memory_mb=512, max_workers=2)
    scan = hostile.mixed_scan_pdf([None])
    try:
        with ThreadPoolExecutor(4) as executor:
            docs = list(
                executor.map(lambda n: pool.parse(DocKind.PDF, scan, f"{n}.pdf", timeout_s=60, ocr=ocr_of(n)), range(6))
            )
        assert [d.text for d in docs] == [f"document {i}" for i in range(6)]
        assert most == 2
        assert len(set(_parser_workers()) - others) == 2, "four callers, two worker processes"
    finally:
        pool.close()


def _parser_workers() -> list[int]:
    """The live parser worker processes this process started (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"worker_main" in command:
            found.append(int(entry.name))
    return found


def test_damaged_zip_is_named() -> None:
    with pytest.raises(UnsupportedFileType, match="damaged"):
        detect(b"PK\x03\x04" + bytes(60), "broken.docx")


def test_a_worker_that_cannot_start_is_a_service_error_not_a_bad_file(settings: Settings) -> None:
    from rag.core.errors import RagError

    pool = ParserPool(memory_mb=16, max_workers=1)  # too little for the interpreter itself
    try:
        with pytest.raises(RagError, match="did not start") as info:
            load_document(hostile.text_pdf(["x"]), "x.pdf", settings, pool=pool)
        assert not isinstance(info.value, DocumentRejected)
        assert pool._count == 0
    finally:
        pool.close()


@pytest.mark.parametrize("codec", ["cp1252", "latin-1"])
def test_short_western_texts_in_cp1252_or_latin1_are_read_as_written(codec: str) -> None:
    from ingest.detect import decode_text
    from tests.western_samples import SAMPLES

    samples = [s for s in SAMPLES if codec == "cp1252" or "œ" not in s]  # Latin-1 has no œ
    wrong = [(s, decode_text(s.encode(codec))) for s in samples if decode_text(s.encode(codec))[0] != s]
    assert wrong == []


@pytest.mark.parametrize(
    ("text", "codec"),
    [
        ("Příliš žluťoučký kůň úpěl ďábelské ódy.", "cp1250"),
        ("Zażółć gęślą jaźń, to zdanie ma polskie litery.", "cp1250"),
        ("Съешь же ещё этих мягких французских булок, да выпей чаю.", "cp1251"),
        ("Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "cp1253"),
    ],
)
def test_other_single_byte_pages_still_win_where_they_fit(text: str, codec: str) -> None:
    from ingest.detect import decode_text

    assert decode_text(text.encode(codec))[0] == text
