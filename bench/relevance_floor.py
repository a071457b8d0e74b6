"""Calibrates the "not in the documents" floor (RAG_MIN_RELEVANCE) on SQuAD dev and CMRC trial.

The fused score of rag/answering/retrieval.py is min-max normalised per query, so its best value is 1
for every question, relevant or not: it cannot be a floor. This script measures scores that mean the
same across queries, for each question's top-k (production `Retriever.search`, real Chroma on disk,
the tantivy index):

- `cosine`: the best raw cosine between the query and a retrieved chunk (the embedder's own scale);
- `coverage`: the best IDF-weighted share of the query's search terms (stop words out, stemmed, CJK
  bigrams) that one retrieved chunk contains;
- `blend<s>`: the best `a * cosine + (1 - a) * coverage` of one chunk, with `a` the query's dense
  weight scaled by s (a CJK query, whose MiniLM vector is noise, is judged by its coverage alone);
  `blend<RAG_RELEVANCE_DENSE_SCALE>` (the embedder's: 1.0 for MiniLM, 1.5 for multilingual-e5-small) is
  `rag.answering.retrieval.relevance`, the score RAG_MIN_RELEVANCE applies to.

Positives are questions asked of the collection that holds their paragraph; negatives are questions
that no document of the collection answers:

- SQuAD: the articles are split in two halves by a hash of their title; the collection holds the
  paragraphs of one half. Positives: questions of that half. Negatives: questions of the other half
  (English questions about other Wikipedia articles: the hard kind of off-topic);
- CMRC questions against the same SQuAD collection (another language);
- CMRC positives: CMRC questions against a collection of all CMRC paragraphs.

For every threshold it prints the share of negatives refused, the share of positives that keep their
sources, and SQuAD hybrid recall@5 when a refused question counts as not found. The chosen floor is the
highest one that keeps >= 97% of positives and SQuAD recall@5 within 0.01 of no floor.

    .venv/bin/python -m bench.relevance_floor --json bench/results/relevance_floor.json

Embeddings come from `--embedder` in-process (the bundled all-MiniLM-L6-v2 by default, or
multilingual-e5-small with its prompts), cached like bench/retrieval_quality.py. Its cosines have their
own scale (E5's crowd around 0.8), so the floors are calibrated per embedder: the chosen ones go into
rag/core/config.py's CALIBRATED under the embedder's name, beside its tuned hybrid weights.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench.retrieval_quality import EMBEDDERS, EmbeddingCache, embedder_folder, make_splitter, sentence_encoder
from rag.answering.retrieval import Retriever, relevance, relevance_floor
from rag.core.config import Settings
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex

THRESHOLDS = [round(0.01 * i, 2) for i in range(101)]
KINDS = {
    "squad+": "SQuAD questions, their article in the SQuAD collection",
    "cmrc+": "CMRC questions, against the CMRC collection",
    "squad-": "SQuAD questions of other articles, against the SQuAD collection (hard: same style, same wiki)",
    "squad-x": "SQuAD questions against the CMRC collection (unrelated documents)",
    "cmrc-": "CMRC questions against the SQuAD collection",
}
ISSUE_NEGATIVES = ("cmrc-", "squad-x")  # the negatives as the target defines them; squad- is reported apart
BLENDS = (0.5, 1.0, 1.5)  # scales of the query's dense weight; 1.0 is what the answering core uses
SCORES = ("cosine", "coverage", *(f"blend{b}" for b in BLENDS))


@dataclass
class Asked:
    """One question against one collection."""

    kind: str  # squad+ | cmrc+ (positives) | squad- | squad-x | cmrc- (negatives): see KINDS
    text: str
    answers: list[str]
    doc_id: str | None  # its paragraph, when the collection holds it
    article: str = ""  # the title of its own article (CMRC's: its index)


def _h(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest()[:8], 16)


def read(name: str) -> list[tuple[str, list[tuple[str, list[tuple[str, list[str]]]]]]]:
    """[(title, [(paragraph, [(question, answers)])])]."""
    raw = datasets.read(name)
    articles = []
    for article in raw["data"]:
        paragraphs = []
        for p in article["paragraphs"]:
            qas = [
                (qa["question"], sorted({a["text"].strip() for a in qa["answers"] if a["text"].strip()}))
                for qa in p["qas"]
            ]
            paragraphs.append((p["context"], [(q, a) for q, a in qas if a]))
        articles.append((str(article.get("title", "")), paragraphs))
    return articles


def sample(items: list[Asked], n: int) -> list[Asked]:
    return sorted(items, key=lambda a: _h(a.text))[:n]


def build(args: argparse.Namespace) -> tuple[dict[str, dict[str, tuple[str, str]]], dict[str, list[Asked]]]:
    """The two collections' chunks (chunk_id -> (doc_id, text)) and the questions asked of each."""
    split = make_splitter(args.model_path, 200, 32)
    squad_chunks: dict[str, tuple[str, str]] = {}
    pos, neg = [], []
    for a, (title, paragraphs) in enumerate(read("squad")):
        inside = _h(title) % 2 == 0
        for p, (context, qas) in enumerate(paragraphs):
            doc_id = f"s{a:03d}-{p:03d}"
            if inside:
                for i, text in enumerate(split(context)):
                    squad_chunks[f"{doc_id}:{i}"] = (doc_id, text)
            (pos if inside else neg).extend(
                Asked("squad+" if inside else "squad-", q, ans, doc_id if inside else None, title) for q, ans in qas
            )
    cmrc_chunks: dict[str, tuple[str, str]] = {}
    cmrc = []
    for a, (_, paragraphs) in enumerate(read("cmrc")):
        for p, (context, qas) in enumerate(paragraphs):
            doc_id = f"c{a:03d}-{p:03d}"
            for i, text in enumerate(split(context)):
                cmrc_chunks[f"{doc_id}:{i}"] = (doc_id, text)
            cmrc.extend(Asked("cmrc+", q, ans, doc_id, f"cmrc-{a}") for q, ans in qas)
    half = min(args.questions, len(cmrc) // 2)  # CMRC trial holds about 1,000 questions: half for each collection
    cmrc_pos = sample(cmrc, half)
    cmrc_neg = [Asked("cmrc-", q.text, q.answers, None, q.article) for q in sample(cmrc, 2 * half)[half:]]
    squad_neg = sample(neg, args.questions)
    unrelated = [Asked("squad-x", q.text, q.answers, None, q.article) for q in squad_neg]
    asked = {
        "squad": sample(pos, args.questions) + squad_neg + cmrc_neg,
        "cmrc": cmrc_pos + unrelated,
    }
    return {"squad": squad_chunks, "cmrc": cmrc_chunks}, asked


class _Embedder:
    """The cache with the embedder's prompt of each kind in front (E5's; none for MiniLM)."""

    def __init__(self, cache: EmbeddingCache, prompts: dict[str, str]) -> None:
        self.cache = cache
        self.prompts = prompts

    def vectors(self, texts: Sequence[str], kind: str) -> Any:
        return self.cache.embed([self.prompts.get(kind, "") + t for t in texts])

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        return self.vectors(texts, kind).tolist()


class _AllIndexed:
    def indexed_names(self, collection: str, doc_ids) -> dict[str, str]:
        return dict.fromkeys(doc_ids, "")


def index_chunks(store: Any, lexical: Any, collection: str, held: dict[str, tuple[str, str]], cache: Any) -> None:
    """Write `held` (chunk id -> (doc id, text)) into Chroma and the BM25 index with cached vectors."""
    ids = list(held)
    vectors = cache.vectors([held[i][1] for i in ids], "passage")
    for start in range(0, len(ids), 1000):
        part = ids[start : start + 1000]
        store.upsert(
            collection,
            part,
            vectors[start : start + 1000].tolist(),
            [held[i][1] for i in part],
            [{"doc_id": held[i][0]} for i in part],
        )
    lexical.add(collection, [(i, held[i][0], held[i][1]) for i in ids])


async def measure(
    chunks: dict[str, dict[str, tuple[str, str]]],
    asked: dict[str, list[Asked]],
    embedder: _Embedder,
    workdir: Path,
    args: argparse.Namespace,
) -> list[dict]:
    """Per question: its kind, the scores, and the rank of its first answer-bearing chunk."""
    settings = Settings(data_dir=workdir, embed_model=args.embedder)
    store = ChunkStore.open(settings)
    lexical = LexicalIndex(workdir / "lexical.sqlite")
    retriever = Retriever(embedder, store, lexical, _AllIndexed(), settings)
    k = args.k
    rows = []
    for collection, held in chunks.items():
        index_chunks(store, lexical, collection, held, embedder)
        embedder.vectors([q.text for q in asked[collection]], "query")
        for q in asked[collection]:
            hits = await retriever.search(q.text, collection=collection, k=k)
            rank = next(
                (
                    r
                    for r, h in enumerate(hits, 1)
                    if h.doc_id == q.doc_id
                    and any(" ".join(a.lower().split()) in " ".join(h.text.lower().split()) for a in q.answers)
                ),
                None,
            )
            rows.append(
                {
                    "kind": q.kind,
                    "text": q.text,
                    "rank": rank,
                    "cosine": max((h.cosine for h in hits if h.cosine is not None), default=0.0),
                    "coverage": max((h.coverage for h in hits), default=0.0),
                    **{f"blend{b}": relevance(q.text, hits, settings, blend=b) for b in BLENDS},
                    # every hit's, in rank order: for other scores than the best one (a gap, a spread)
                    "cosines": [round(h.cosine, 4) if h.cosine is not None else None for h in hits],
                    "coverages": [round(h.coverage, 4) for h in hits],
                }
            )
    lexical.close()
    return rows


def _share(rows: Sequence[dict], test: Callable[[dict], bool]) -> float:
    return round(sum(map(test, rows)) / len(rows), 4) if rows else 0.0


def _found5(r: dict) -> bool:
    return r["rank"] is not None and r["rank"] <= 5


def curve(rows: Sequence[dict], score: str, positive: str, negatives: Sequence[str]) -> list[dict]:
    """Per threshold: the share of each negative group refused, of positives kept, and positives' R@5."""
    pos = [r for r in rows if r["kind"] == positive]
    out = []
    for t in THRESHOLDS:
        row = {
            "threshold": t,
            "kept": _share(pos, lambda r: r[score] >= t),
            "recall@5": _share(pos, lambda r: _found5(r) and r[score] >= t),
        }
        for kind in negatives:
            row[f"refused {kind}"] = _share([r for r in rows if r["kind"] == kind], lambda r: r[score] < t)
        out.append(row)
    return out


def choose(table: list[dict]) -> dict:
    """The highest threshold that keeps >= 97% of the positives and their R@5 within 0.01."""
    base = table[0]["recall@5"]
    return max(
        (r for r in table if r["kept"] >= 0.97 and base - r["recall@5"] <= 0.01 + 1e-9), key=lambda r: r["threshold"]
    )


def production(rows: Sequence[dict], floors: tuple[float, float], embedder: str) -> dict:
    """Every group under the per-query floor of the answering core (relevance_floor), on its score."""
    settings = Settings(min_relevance=floors[0], min_relevance_cjk=floors[1], embed_model=embedder)

    def passes(r: dict) -> bool:
        return r[f"blend{settings.relevance_dense_scale}"] >= relevance_floor(r["text"], settings)

    by = {kind: [r for r in rows if r["kind"] == kind] for kind in KINDS}
    out = {"min_relevance": floors[0], "min_relevance_cjk": floors[1]}
    for kind in KINDS:
        out[("kept " if kind.endswith("+") else "refused ") + kind] = _share(
            by[kind], passes if kind.endswith("+") else (lambda r: not passes(r))
        )
    out["refused, negatives of the target (cmrc-, squad-x)"] = _share(
        [r for k in ISSUE_NEGATIVES for r in by[k]], lambda r: not passes(r)
    )
    out["refused, all negatives (with the hard squad-)"] = _share(
        [r for k in KINDS if not k.endswith("+") for r in by[k]], lambda r: not passes(r)
    )
    out["kept, all positives"] = _share(by["squad+"] + by["cmrc+"], passes)
    out["squad recall@5 without floor"] = _share(by["squad+"], _found5)
    out["squad recall@5 with floor"] = _share(by["squad+"], lambda r: _found5(r) and passes(r))
    return out


def _print_curve(title: str, table: list[dict], best: dict) -> None:
    print(f"\n== {title}: chosen {best['threshold']:.2f}")
    keys = list(table[0])
    print("  " + "  ".join(f"{k:>16}" for k in keys))
    for row in table:
        if round(row["threshold"] * 100) % 5 == 0 or row is best:
            print("  " + "  ".join(f"{row[k]:>16.3f}" for k in keys) + ("  <- chosen" if row is best else ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=500, help="questions per group (a fixed hash sample)")
    parser.add_argument("--k", type=int, default=Settings().top_k, help="chunks retrieved per question (RAG_TOP_K)")
    parser.add_argument("--embedder", choices=EMBEDDERS, default="all-MiniLM-L6-v2")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "rag-stack" / "bench")
    parser.add_argument("--json", type=Path, default=None, help="write the curves and the per-question scores here")
    datasets.add_options(parser, "squad", "cmrc")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    args.model_path, prompts = embedder_folder(args.embedder)
    # E5's vectors are shared with bench/retrieval_quality.py's (same chunks, same prompts): run one after the other.
    cache_name = "minilm-relevance.npz" if args.embedder == "all-MiniLM-L6-v2" else f"{args.embedder}.npz"
    embedder = _Embedder(EmbeddingCache(args.cache_dir / cache_name, sentence_encoder(args.model_path)), prompts)
    chunks, asked = build(args)
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(measure(chunks, asked, embedder, Path(tmp), args))
    counts = {kind: sum(r["kind"] == kind for r in rows) for kind in KINDS}
    print(f"questions: {counts}; squad collection {len(chunks['squad'])} chunks, cmrc {len(chunks['cmrc'])}")
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    result: dict = {"embedder": args.embedder, "kinds": KINDS, "questions": counts, "k": args.k, "scores": {}}
    for score in SCORES:
        english = curve(rows, score, "squad+", ("squad-", "squad-x", "cmrc-"))
        cjk = curve(rows, score, "cmrc+", ("cmrc-", "squad-x"))
        result["scores"][score] = {
            "english": {"chosen": choose(english), "curve": english},
            "cjk": {"chosen": choose(cjk), "curve": cjk},
        }
        if score in ("cosine", "blend1.0"):
            _print_curve(f"{score}, English floor (squad+ positives)", english, choose(english))
            _print_curve(f"{score}, CJK floor (cmrc+ positives)", cjk, choose(cjk))
        else:
            print(f"\n== {score}: English floor {choose(english)}\n   CJK floor {choose(cjk)}")
    chosen = result["scores"][f"blend{Settings(embed_model=args.embedder).relevance_dense_scale}"]
    floors = (chosen["english"]["chosen"]["threshold"], chosen["cjk"]["chosen"]["threshold"])
    result["production"] = production(rows, floors, args.embedder)
    print("\n== the answering core's floors (relevance, RAG_MIN_RELEVANCE / RAG_MIN_RELEVANCE_CJK)")
    for key, value in result["production"].items():
        print(f"  {key:<52} {value}")
    if args.json:
        result["rows"] = rows
        write_json(args.json, result, indent=1)


if __name__ == "__main__":
    main()
