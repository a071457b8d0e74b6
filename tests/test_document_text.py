"""A document's text rebuilt from its chunks in the record (what the MCP document resource serves and the
page viewer's context is cut from): overlaps taken once, a table's repeated header not repeated."""

from __future__ import annotations

from ingest.chunking import Chunker, chunk_document
from ingest.loaders._builder import DocumentBuilder
from ingest.loaders.tables import markdown_table
from ingest.models import DocKind
from rag.store.document_text import stitched


def test_a_table_of_thirty_rows_comes_back_with_its_header_once() -> None:
    builder = DocumentBuilder()
    builder.block("Stock of the depot, as counted in March.")
    table = markdown_table([["Item", "Price", "Stock"], *([f"Kettle K{i}", f"{i}.50", str(i)] for i in range(30))])
    assert table is not None
    builder.table(table.text, table.header)
    builder.block("Counted by hand; prices without VAT.")
    doc = builder.build("stock.txt", DocKind.TEXT)
    chunks = chunk_document(doc, "d", Chunker(lambda t: len(t.split()), chunk_tokens=40, chunk_overlap=4))
    assert sum(table.header in c.text for c in chunks) > 2, "the chunks of rows repeat the header"

    text = stitched([(c.text, c.metadata()) for c in chunks])
    assert text.count(table.header) == 1
    assert text == doc.text
