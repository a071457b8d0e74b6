"""The search side of the lexical index: a tantivy (Rust, Lucene-like) inverted index of the chunks'
tokens, keyed by the SQLite rowid of their record. Its top-k BM25 skips whole posting blocks that cannot
reach the top (block-max WAND)."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import tantivy

from rag.core.errors import StoreLocked

FORMAT = "tantivy-1"  # bump when the search index's schema changes: it is rebuilt from SQLite
_WRITER_HEAP = 32_000_000
_SEP = "\x1f"


def _search_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("tokens", tokenizer_name="whitespace", index_option="freq")
    builder.add_unsigned_field("rowid", indexed=True, fast=True)
    builder.add_text_field("collection", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("doc_key", tokenizer_name="raw", index_option="basic")
    return builder.build()


class Bm25Index:
    """Token documents (rowid, collection, document) in a tantivy index on disk."""

    def __init__(self, directory: Path, *, rebuild: bool) -> None:
        self.directory = directory
        self._schema = _search_schema()
        if rebuild and directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._index = tantivy.Index(self._schema, path=str(directory), reuse=True)

    def reload(self) -> None:
        self._index.reload()

    def num_docs(self) -> int:
        return int(self._index.searcher().num_docs)

    def writer(self, wait_s: float) -> tantivy.IndexWriter:
        """The index's writer, exclusive across processes: StoreLocked when another holds it past `wait_s`."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._index.writer(heap_size=_WRITER_HEAP, num_threads=1)
            except ValueError as exc:
                if "LockBusy" not in str(exc) or time.monotonic() > deadline:
                    raise StoreLocked(
                        f"the lexical index at {self.directory} is being written by another process"
                    ) from exc
                time.sleep(0.05)

    # Writes, through a writer from `writer()`.

    def add(self, writer: tantivy.IndexWriter, rowid: int, collection: str, doc_id: str, tokens: str) -> None:
        doc = tantivy.Document()
        doc.add_text("tokens", tokens)
        doc.add_unsigned("rowid", rowid)
        doc.add_text("collection", collection)
        doc.add_text("doc_key", collection + _SEP + doc_id)
        writer.add_document(doc)

    def delete_rows(self, writer: tantivy.IndexWriter, rowids: list[int]) -> None:
        writer.delete_documents_by_query(tantivy.Query.term_set_query(self._schema, "rowid", rowids))

    @staticmethod
    def delete_document(writer: tantivy.IndexWriter, collection: str, doc_id: str) -> None:
        writer.delete_documents_by_term("doc_key", collection + _SEP + doc_id)

    @staticmethod
    def delete_collection(writer: tantivy.IndexWriter, collection: str) -> None:
        writer.delete_documents_by_term("collection", collection)

    # Reads.

    def document_counts(self, collection: str, doc_ids: Iterable[str]) -> dict[str, int]:
        searcher = self._index.searcher()
        return {
            # tantivy's stub leaves out SearchResult.count (set unless count=False)
            d: searcher.search(tantivy.Query.term_query(self._schema, "doc_key", collection + _SEP + d), 1).count  # type: ignore[attr-defined]
            for d in doc_ids
        }

    def search(self, collection: str, terms: list[str], k: int, doc_ids: list[str] | None) -> list[tuple[float, int]]:
        """(BM25 score, rowid) of the k best documents holding any of `terms`, optionally within some documents."""
        Q, Occur = tantivy.Query, tantivy.Occur
        any_term = Q.boolean_query([(Occur.Should, Q.term_query(self._schema, "tokens", t, "freq")) for t in terms])
        clauses = [(Occur.Must, any_term), (Occur.Must, self._filter("collection", [collection]))]
        if doc_ids:
            clauses.append((Occur.Must, self._filter("doc_key", [collection + _SEP + d for d in doc_ids])))
        searcher = self._index.searcher()
        hits = searcher.search(Q.boolean_query(clauses), k, count=False).hits
        if not hits:
            return []
        rowids = cast(list[int], searcher.fast_field_values("rowid", [address for _, address in hits]))  # an int field
        # Equal scores in one order: tantivy's follows segments, which its merges renumber.
        return sorted(((float(score), rowid) for (score, _), rowid in zip(hits, rowids)), key=lambda h: (-h[0], h[1]))

    def held(self, collection: str, terms: Iterable[str], doc_ids: list[str] | None = None) -> set[str]:
        """The terms that some chunk of the collection holds (of the documents `doc_ids`, when given)."""
        Q, Occur = tantivy.Query, tantivy.Occur
        scope = [(Occur.Must, self._filter("collection", [collection]))]
        if doc_ids:
            scope.append((Occur.Must, self._filter("doc_key", [collection + _SEP + d for d in doc_ids])))
        searcher = self._index.searcher()
        return {
            t
            for t in set(terms)
            if searcher.search(
                Q.boolean_query([(Occur.Must, Q.term_query(self._schema, "tokens", t)), *scope]), 1, count=False
            ).hits
        }

    def idf(self, terms: Iterable[str], prior_docs: int = 1000) -> dict[str, float]:
        """BM25's inverse document frequency of each term over the whole index (all collections).

        A term no chunk holds gets the highest weight: a question about something absent is off-topic.
        The counts are smoothed with `prior_docs` documents that hold none of the terms: in a small
        collection, where a document frequency means little ("story" is absent from three documents
        about towers and rivers), every term then weighs about the same.
        """
        searcher = self._index.searcher()
        n = searcher.num_docs + prior_docs
        return {t: math.log(1 + (n - (df := searcher.doc_freq("tokens", t)) + 0.5) / (df + 0.5)) for t in set(terms)}

    def _filter(self, field: str, values: list[str]) -> tantivy.Query:
        """Matches documents with one of the values, adding nothing to the BM25 score."""
        return tantivy.Query.const_score_query(tantivy.Query.term_set_query(self._schema, field, values), 0.0)
