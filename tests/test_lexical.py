"""The lexical index: tokenization (English words, CJK bigrams) and the persisted tantivy BM25 index."""

from __future__ import annotations

import shutil
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag.core.errors import StoreLocked
from rag.store.chunk_record import LexicalIndex, Tokenizer, cjk_fraction, lexical_tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("北京大学", ["北京", "京大", "大学"]),
        ("书", ["书"]),
        ("北京，上海", ["北京", "上海"]),  # punctuation ends a run: no bigram across it
        ("東京タワー", ["東京", "京タ", "タワ", "ワー"]),
        ("서울대학교", ["서울", "울대", "대학", "학교"]),
        ("Python的装饰器", ["的装", "装饰", "饰器", "python"]),
        ("The universities were founded", ["universiti", "found"]),
        ("It's running!", ["run"]),
        ("Über café naïve", ["über", "café", "naïve"]),  # not ASCII: not stemmed, kept whole
        ("In 1890, 3.5 GHz", ["1890", "3", "5", "ghz"]),
        ("snake_case words", ["snake", "case", "word"]),
        ("", []),
        ("the of and", []),
    ],
)
def test_tokens(text: str, tokens: list[str]) -> None:
    assert lexical_tokens(text) == tokens


def test_tokenizer_variants() -> None:
    assert Tokenizer(stem=False, stopwords=False)("The Founders") == ["the", "founders"]
    assert Tokenizer(stem=False)("The Founders") == ["founders"]
    assert Tokenizer().name != Tokenizer(stem=False).name


@pytest.mark.parametrize(("text", "fraction"), [("北京大学", 1.0), ("hello", 0.0), ("ab北京", 0.5), ("？！", 0.0)])
def test_cjk_fraction(text: str, fraction: float) -> None:
    assert cjk_fraction(text) == fraction


@given(st.text())
def test_tokens_never_fail_and_are_fts_safe(text: str) -> None:
    for token in lexical_tokens(text):
        assert token and " " not in token and '"' not in token


@pytest.fixture
def index(tmp_path: Path) -> LexicalIndex:
    ix = LexicalIndex(tmp_path / "lexical.sqlite")
    ix.add(
        "docs",
        [
            ("a:0", "a", "The University of Chicago was founded in 1890 by John D. Rockefeller."),
            ("a:1", "a", "Its campus lies in the Hyde Park neighborhood on the South Side."),
            ("b:0", "b", "北京大学创建于1898年，初名京师大学堂，是中国近代第一所国立综合性大学。"),
            ("c:0", "c", "Super Bowl 50 was an American football game played in Santa Clara."),
        ],
    )
    ix.add("other", [("z:0", "z", "The University of Chicago campus in a second collection.")])
    return ix


def ids(hits: list) -> list[str]:
    return [h.chunk_id for h in hits]


def test_search_english_with_stemming(index: LexicalIndex) -> None:
    assert ids(index.search("docs", "When was the university founding?", 3))[0] == "a:0"
    assert ids(index.search("docs", "Where is the campus?", 3)) == ["a:1"]


def test_search_chinese_bigrams(index: LexicalIndex) -> None:
    hits = index.search("docs", "北京大学是哪一年创建的？", 3)
    assert ids(hits) == ["b:0"] and hits[0].doc_id == "b" and hits[0].score > 0


def test_scores_are_sorted_best_first(index: LexicalIndex) -> None:
    hits = index.search("docs", "university campus Chicago Super Bowl", 10)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert set(ids(hits)) == {"a:0", "a:1", "c:0"}


def test_collections_are_separate(index: LexicalIndex) -> None:
    assert ids(index.search("other", "Chicago campus", 5)) == ["z:0"]
    assert "z:0" not in ids(index.search("docs", "Chicago campus second collection", 5))
    assert index.search("missing", "Chicago", 5) == []


def test_the_terms_a_collection_holds(index: LexicalIndex) -> None:
    asked = ["chicago", "rockefel", "mongodb", "北京"]
    assert index.held("docs", asked) == {"chicago", "rockefel", "北京"}
    assert index.held("other", asked) == {"chicago"}  # a collection of its own: Rockefeller is not in it
    assert index.held("docs", asked, doc_ids=["b"]) == {"北京"}
    assert index.held("missing", asked) == set()


def test_document_filter(index: LexicalIndex) -> None:
    assert ids(index.search("docs", "university campus Super Bowl", 5, doc_ids=["c"])) == ["c:0"]
    assert index.search("docs", "Chicago", 5, doc_ids=["b", "c"]) == []


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("", set()),
        ("   ", set()),
        ("the of", set()),  # stop words only: no search term
        ("？？", set()),
        ('C++ "AND" OR NEAR(x) * -', set()),  # query syntax is text: these words are in no chunk
        ("title:university", {"a:0"}),  # no field syntax: the words are searched
        ('"Chicago" AND (campus OR -Hyde)', {"a:0", "a:1"}),
    ],
)
def test_odd_queries_do_not_fail(index: LexicalIndex, query: str, found: set[str]) -> None:
    assert set(ids(index.search("docs", query, 5))) == found


def test_readding_a_chunk_replaces_it(index: LexicalIndex) -> None:
    index.add("docs", [("a:0", "a", "Completely different text about volcanoes.")])
    assert index.count_document("docs", "a") == 2
    assert index.search("docs", "Rockefeller", 5) == []
    assert ids(index.search("docs", "volcano", 5)) == ["a:0"]


def test_context_is_searched_with_the_chunk(index: LexicalIndex, tmp_path: Path) -> None:
    index.add("docs", [("q:1", "q", "It withdrew from the market in 2017.", "Dairy Queen")])
    assert ids(index.search("docs", "When did Dairy Queen withdraw?", 1)) == ["q:1"]
    index.close()
    rebuilt = LexicalIndex(tmp_path / "lexical.sqlite", Tokenizer(stem=False))  # rebuilt from SQLite
    assert ids(rebuilt.search("docs", "Dairy Queen", 1)) == ["q:1"]


def test_delete_document_and_collection(index: LexicalIndex) -> None:
    assert index.delete_document("docs", "a") == 2
    assert index.count_document("docs", "a") == 0
    assert index.search("docs", "Chicago campus", 5) == []
    assert index.count("other") == 1  # the same doc id elsewhere is untouched
    assert index.delete_collection("docs") == 2
    assert index.count("docs") == 0 and index.count("other") == 1


def test_search_counts_per_document(index: LexicalIndex) -> None:
    assert index.search_counts("docs", ["a", "b", "z", "unknown"]) == {"a": 2, "b": 1, "z": 0, "unknown": 0}
    index.delete_document("docs", "a")
    assert index.search_counts("docs", ["a"]) == {"a": 0}


def test_failed_add_leaves_nothing_behind(index: LexicalIndex) -> None:
    rows = [("d:0", "d", "volcano one"), ("d:1", None, "volcano two")]  # NOT NULL fails on the second row
    with pytest.raises(sqlite3.IntegrityError):
        index.add("docs", rows)  # type: ignore[arg-type]
    assert index.count_document("docs", "d") == 0
    assert index.search("docs", "volcano", 5) == []


def test_searches_do_not_wait_for_a_write_in_progress(index: LexicalIndex) -> None:
    with index._writer() as writer:  # an ingest's write, held open
        writer.delete_all_documents()
        with ThreadPoolExecutor(1) as pool:
            hits = pool.submit(index.search, "docs", "Rockefeller", 5).result(timeout=5)
    assert ids(hits) == ["a:0"]  # the last committed state
    assert index.search("docs", "Rockefeller", 5) == []  # committed now


def test_a_second_writer_waits_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = LexicalIndex(tmp_path / "lexical.sqlite")
    second = LexicalIndex(tmp_path / "lexical.sqlite")  # as another process would open it
    with ThreadPoolExecutor(1) as pool:
        with first._writer():
            waiting = pool.submit(second.add, "docs", [("w:0", "w", "written while another writer held the lock")])
            time.sleep(0.3)
            assert not waiting.done()
        waiting.result(timeout=10)
    assert ids(first.search("docs", "lock", 5)) == ["w:0"]
    monkeypatch.setattr("rag.store.chunk_record._WRITER_WAIT_S", 0.2)
    with first._writer(), pytest.raises(StoreLocked):
        second.delete_document("docs", "w")


@pytest.mark.parametrize("damage", ["dirty", "index gone", "index emptied"])
def test_an_index_out_of_step_is_rebuilt_on_opening(index: LexicalIndex, tmp_path: Path, damage: str) -> None:
    index.close()
    if damage == "dirty":  # a crash between the SQLite commit and the index commit
        with sqlite3.connect(tmp_path / "lexical.sqlite") as db:
            db.execute("INSERT INTO meta (key, value) VALUES ('dirty', '1')")
    elif damage == "index gone":
        shutil.rmtree(tmp_path / "lexical.tantivy")
    else:
        index = LexicalIndex(tmp_path / "lexical.sqlite")
        with index._writer() as writer:
            writer.delete_all_documents()
        index.close()
    reopened = LexicalIndex(tmp_path / "lexical.sqlite")
    assert ids(reopened.search("docs", "Rockefeller", 5)) == ["a:0"]
    assert ids(reopened.search("other", "Chicago", 5)) == ["z:0"]


def test_persisted_and_retokenized_when_the_tokenizer_changes(index: LexicalIndex, tmp_path: Path) -> None:
    index.close()
    reopened = LexicalIndex(tmp_path / "lexical.sqlite")
    assert ids(reopened.search("docs", "founding", 5)) == ["a:0"]
    reopened.close()
    unstemmed = LexicalIndex(tmp_path / "lexical.sqlite", Tokenizer(stem=False))
    assert unstemmed.search("docs", "founding", 5) == []  # rebuilt without stems
    assert ids(unstemmed.search("docs", "founded", 5)) == ["a:0"]
    assert unstemmed.count("docs") == 4
