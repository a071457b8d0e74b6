"""Table questions: recall@5 of a chunk that holds both the asked row and its header, on generated PDFs.

Six ruled tables (a price list over three pages, a city table, a staff directory, compounds, a train
timetable, a small one), from seeded random data with made-up names, are written as born-digital PDFs
(`tests/table_docs.py`) and read by the loader in its worker (`ingest.loading.load_document`: pdfplumber
for the tables) and chunked by the production chunker (MiniLM's tokenizer, 200 tokens). A question is
asked per sampled cell: "What is the <column> of <row>?"; it is answered at rank r when the r-th chunk of
the production `Retriever.search` (Chroma on disk, tantivy BM25, hybrid fusion) holds the row's name, the
cell's value and the column's name. The same PDFs read as before tables were tables (PDFium's page text:
the cells in reading order, the header on the first page only) are the baseline, searched the same way.

With `--scanned`, the same PDFs are also printed and scanned back (`tests/scans.py`: each page rendered at
`--dpi`, tilted up to 1 degree, speckled, JPEG at quality 60, as an image-only PDF) and read by the real
OCR worker (`ingest.loaders.ocr`: aligned OCR boxes become markdown rows under the header), and asked the
same questions; their baseline is the same OCR text with the header left where it was printed (on the
first page only, not repeated in each chunk).

    .venv/bin/python -m bench.tables --json bench/results/tables.json | tee bench/results/tables.txt
    nice .venv/bin/python -m bench.tables --scanned --json bench/results/tables-scanned.json \
        | tee bench/results/tables-scanned.txt                        # + ~14 pages of OCR, ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._provenance import header, write_json  # noqa: E402
from bench.relevance_floor import _AllIndexed, _Embedder, index_chunks  # noqa: E402
from bench.retrieval_quality import EmbeddingCache, sentence_encoder  # noqa: E402
from ingest.loaders._builder import DocumentBuilder  # noqa: E402
from ingest.loading import load_document  # noqa: E402
from ingest.models import DocKind, LoadedDocument  # noqa: E402
from ingest.pipeline import make_chunker  # noqa: E402
from rag.answering.retrieval import Retriever  # noqa: E402
from rag.core.config import Settings  # noqa: E402
from rag.store.chroma_vectors import ChunkStore  # noqa: E402
from rag.store.chunk_record import LexicalIndex  # noqa: E402
from tests import scans  # noqa: E402
from tests.table_docs import table_pdf  # noqa: E402

K = 5
_SYLLABLES = "ka lo mir ten vas qui dor bel zan rut fen gal hos pri mek sol tav nor yel dru".split()
_ADJECTIVES = (
    "amber brisk coral dusky ember frosty golden hazel ivory jade lunar misty olive plum rustic silver".split()
)
_NOUNS = "kettle lantern satchel teapot compass ladle trowel bucket easel anvil whistle goblet".split()


@dataclass
class Table:
    name: str
    caption: str
    header: list[str]
    rows: list[list[str]]


def _word(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _unique(rng: random.Random, n: int, make) -> list[str]:
    seen: dict[str, None] = {}
    while len(seen) < n:
        seen.setdefault(make(rng), None)
    return list(seen)


def tables(seed: int) -> list[Table]:
    rng = random.Random(seed)
    items = _unique(
        rng,
        120,
        lambda r: f"{r.choice(_ADJECTIVES).capitalize()} {r.choice(_NOUNS)} {r.choice('ABCDEFGH')}{r.randint(1, 9)}",
    )
    cities = _unique(rng, 60, lambda r: _word(r, 3))
    people = _unique(rng, 80, lambda r: f"{_word(r, 2)} {_word(r, 3)}")
    compounds = _unique(rng, 40, lambda r: _word(r, 2).lower() + "ide")
    trains = _unique(rng, 50, lambda r: f"IC {r.randint(100, 999)}")
    return [
        Table(
            "price_list",
            "Table 1: Price list, December",
            ["Item", "Price", "Stock", "Depot"],
            [
                [i, f"{rng.randint(2, 400)}.{rng.randint(0, 99):02d} EUR", str(rng.randint(0, 900)), _word(rng, 2)]
                for i in items
            ],
        ),
        Table(
            "cities",
            "Table 2: Cities of the survey",
            ["City", "Region", "Population", "Rainfall"],
            [[c, _word(rng, 2), f"{rng.randint(2, 900) * 1000:,}", f"{rng.randint(200, 1900)} mm"] for c in cities],
        ),
        Table(
            "staff",
            "Staff directory",
            ["Name", "Department", "Office", "Extension"],
            [
                [
                    p,
                    rng.choice(["Finance", "Legal", "Sales", "Research", "Support", "Logistics"]),
                    f"{rng.choice('NSEW')}-{rng.randint(100, 499)}",
                    str(rng.randint(2000, 7999)),
                ]
                for p in people
            ],
        ),
        Table(
            "compounds",
            "Table 4: Compounds tested",
            ["Compound", "Melting point", "Density", "Supplier"],
            [
                [c, f"{rng.randint(-80, 900)} C", f"{rng.randint(5, 220) / 10:.1f} g/cm3", _word(rng, 2)]
                for c in compounds
            ],
        ),
        Table(
            "trains",
            "Timetable, line 7",
            ["Train", "Departs", "Arrives", "Platform"],
            [
                [
                    t,
                    f"{rng.randint(5, 22):02d}:{rng.randint(0, 59):02d}",
                    f"{rng.randint(5, 23):02d}:{rng.randint(0, 59):02d}",
                    str(rng.randint(1, 14)),
                ]
                for t in trains
            ],
        ),
        Table(
            "fees",
            "Table 6: Membership fees",
            ["Plan", "Monthly fee", "Visits"],
            [
                [p, f"{rng.randint(10, 90)} EUR", str(rng.randint(4, 30))]
                for p in ["Bronze", "Silver", "Gold", "Platinum", "Student", "Family"]
            ],
        ),
    ]


@dataclass
class Question:
    doc_id: str
    text: str
    row: str
    column: str
    value: str


def questions(tables_: Sequence[Table], n: int, seed: int) -> list[Question]:
    cells = [
        Question(t.name, f"What is the {col.lower()} of {row[0]}?", row[0], col, row[j])
        for t in tables_
        for row in t.rows
        for j, col in enumerate(t.header)
        if j
    ]
    return random.Random(seed).sample(cells, min(n, len(cells)))


def _plain(data: bytes, name: str) -> LoadedDocument:
    """The document as it was read before tables were tables: PDFium's text of each page."""
    import pypdfium2 as pdfium

    builder = DocumentBuilder()
    pdf = pdfium.PdfDocument(data)
    for index in range(len(pdf)):
        builder.page(index + 1)
        builder.block(pdf[index].get_textpage().get_text_range().replace("\r\n", "\n"))
    pdf.close()
    return builder.build(name, DocKind.PDF)


def _pdf(t: Table) -> bytes:
    return table_pdf(t.caption, t.header, t.rows, intro=f"{t.caption} as of this month.", outro="End of the table.")


def chunk_sets(tables_: Sequence[Table], settings: Settings) -> tuple[dict, dict, dict]:
    chunker = make_chunker(settings)
    tabled: dict[str, tuple[str, str]] = {}
    plain: dict[str, tuple[str, str]] = {}
    stats = {}
    for t in tables_:
        data = _pdf(t)
        started = time.perf_counter()
        doc = load_document(data, f"{t.name}.pdf", settings)
        load_s = time.perf_counter() - started
        for chunk in chunker.chunk(doc, t.name):
            tabled[chunk.id] = (t.name, chunk.text)
        for chunk in chunker.chunk(_plain(data, f"{t.name}.pdf"), t.name):
            plain[chunk.id] = (t.name, chunk.text)
        stats[t.name] = {
            "rows": len(t.rows),
            "columns": len(t.header),
            "pages": doc.pages,
            "load_s": round(load_s, 3),
            "chunks": sum(1 for d, _ in tabled.values() if d == t.name),
        }
    return tabled, plain, stats


def scanned_chunk_sets(tables_: Sequence[Table], settings: Settings, dpi: int) -> tuple[dict, dict, dict]:
    """The tables' PDFs scanned and read by OCR: chunks with the header in each, and with it only where printed."""
    chunker = make_chunker(settings)
    tabled: dict[str, tuple[str, str]] = {}
    once: dict[str, tuple[str, str]] = {}
    stats = {}
    for n, t in enumerate(tables_):
        data = scans.scan_of_pdf(_pdf(t), dpi=dpi, seed=100 * n)
        started = time.perf_counter()
        doc = load_document(data, f"{t.name}-scan.pdf", settings)
        load_s = time.perf_counter() - started
        for chunk in chunker.chunk(doc, t.name):
            tabled[chunk.id] = (t.name, chunk.text)
        as_text = replace(doc, sections=tuple(replace(s, table_header="") for s in doc.sections))
        for chunk in chunker.chunk(as_text, t.name):
            once[chunk.id] = (t.name, chunk.text)
        table_sections = [s for s in doc.sections if s.table_header]
        stats[t.name] = {
            "rows": len(t.rows),
            "pages": doc.pages,
            "ocr_s": round(load_s, 1),
            "table_sections": len(table_sections),
            "rows_read": sum(s.text.count("\n") - s.table_header.count("\n") for s in table_sections),
            "chunks": sum(1 for d, _ in tabled.values() if d == t.name),
            "warnings": list(doc.warnings),
        }
    return tabled, once, stats


def holds(text: str, q: Question) -> bool:
    """The chunk names the row, its value for the column, and the column."""
    return q.column in text and any(q.row in line and q.value in line for line in text.splitlines())


async def recall(
    chunks: dict[str, tuple[str, str]], asked: Sequence[Question], cache: EmbeddingCache, workdir: Path, collection: str
) -> dict:
    settings = Settings(data_dir=workdir)
    store = ChunkStore.open(settings)
    lexical = LexicalIndex(workdir / "lexical.sqlite")
    retriever = Retriever(_Embedder(cache), store, lexical, _AllIndexed(), settings)
    index_chunks(store, lexical, collection, chunks, cache)
    cache.embed([q.text for q in asked])
    ranks = []
    for q in asked:
        hits = await retriever.search(q.text, collection=collection, k=K)
        ranks.append(next((r for r, h in enumerate(hits, 1) if holds(h.text, q)), None))
    lexical.close()
    found = [r for r in ranks if r is not None]
    by_table: dict[str, list[bool]] = {}
    for q, r in zip(asked, ranks):
        by_table.setdefault(q.doc_id, []).append(r is not None)
    return {
        "recall@1": round(sum(1 for r in found if r == 1) / len(asked), 4),
        f"recall@{K}": round(len(found) / len(asked), 4),
        "by_table": {t: round(sum(v) / len(v), 4) for t, v in sorted(by_table.items())},
        "misses": [q.text for q, r in zip(asked, ranks) if r is None][:15],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=600)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "rag-bench-cache")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--scanned", action="store_true", help="also scan the tables and read them by OCR")
    parser.add_argument("--dpi", type=int, default=200, help="of the scans (with --scanned)")
    args = parser.parse_args(argv)
    print(header())
    settings = Settings()
    set_ = tables(args.seed)
    asked = questions(set_, args.questions, args.seed)
    load_before = os.getloadavg()
    started = time.perf_counter()
    tabled, plain, stats = chunk_sets(set_, settings)
    sets = {"tables": tabled, "plain text (before)": plain}
    scanned_stats: dict = {}
    if args.scanned:
        scanned, once, scanned_stats = scanned_chunk_sets(set_, settings, args.dpi)
        sets |= {"scanned tables": scanned, "scanned, header once": once}
    cache = EmbeddingCache(args.cache_dir / "tables-minilm.npz", sentence_encoder(str(settings.embed_model_dir)))
    results = {}
    for n, (name, chunks) in enumerate(sets.items()):
        with tempfile.TemporaryDirectory() as folder:
            results[name] = asyncio.run(recall(chunks, asked, cache, Path(folder), f"set{n}"))
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()
    print(
        f"{len(asked)} questions over {len(set_)} tables ({sum(len(t.rows) for t in set_)} rows), "
        f"{len(tabled)} chunks as tables, {len(plain)} as plain text; load {load_before[0]:.2f} "
        f"-> {load_after[0]:.2f}; {elapsed:.0f} s"
    )
    print(f"{'':22}{'R@1':>7}{'R@5':>7}   per table (R@5)")
    for name, r in results.items():
        per = "  ".join(f"{t} {v:.2f}" for t, v in r["by_table"].items())
        print(f"{name:22}{r['recall@1']:>7.3f}{r[f'recall@{K}']:>7.3f}   {per}")
    for t, s in stats.items():
        print(
            f"  {t}: {s['rows']} rows x {s['columns']} columns, {s['pages']} page(s), {s['chunks']} chunks, loaded in {s['load_s']} s"
        )
    if scanned_stats:
        pages = sum(s["pages"] for s in scanned_stats.values())
        ocr_s = sum(s["ocr_s"] for s in scanned_stats.values())
        print(f"scanned at {args.dpi} dpi: {pages} pages read by OCR in {ocr_s:.0f} s ({pages / ocr_s:.3f} pages/s)")
        for t, s in scanned_stats.items():
            print(
                f"  {t}: {s['rows_read']} of {s['rows']} rows read as table rows, {s['table_sections']} table section(s)"
                f" on {s['pages']} page(s), {s['chunks']} chunks, {s['ocr_s']} s; warnings: {len(s['warnings'])}"
            )
    if args.json:
        write_json(
            args.json,
            {
                "questions": len(asked),
                "seed": args.seed,
                "k": K,
                "loadavg": list(load_before),
                "loadavg_end": list(load_after),
                "seconds": round(elapsed, 1),
                "dpi": args.dpi if args.scanned else None,
                "documents": stats,
                "scanned_documents": scanned_stats,
                "results": results,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
