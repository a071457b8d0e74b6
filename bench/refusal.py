"""The "not in the documents" decision: today's relevance floor and the signal model side by side.

For every question it retrieves the top-k through the production `Retriever` and keeps the signals of
rag/answering/coverage_rule.py (the dense top cosine and its gap over the k-th, the best and the first
hit's IDF-weighted term coverage, dense/BM25 rank agreement, the query's CJK share), the floor's verdict
(`relevance >= relevance_floor`, the embedder's calibrated floors) and the model's (the committed
`COEFFICIENTS` of the embedder). The groups are bench/relevance_floor.py's:

- squad+ (SQuAD questions, their article in the collection) and squad- (questions of the other half of
  the articles: same wiki, same style), squad-x (SQuAD questions against the CMRC collection), cmrc+ and
  cmrc- (CMRC questions against the CMRC and the SQuAD collection);
- real+ / real- (with `--real-docs DATA_DIR`): bench/real_docs's covered and uncovered questions against
  its corpus indexed by `ingest` into DATA_DIR (collection `real-docs`), follow-ups searched as the
  answering core searches them (the ellipsis rule, then the rule rewrite). Never trained on.

Every SQuAD and CMRC question is in the TRAIN or the TEST split by a hash of its article's title (so no
article is in both); `--fit` fits the logistic regression on TRAIN (scikit-learn, standardised features,
balanced classes), picks the highest probability threshold that keeps each positive group of TRAIN within
0.5 points of the floor, then the highest `named_threshold` (for a question naming something no chunk holds,
rag/answering/named_terms.py) that keeps each within 0.5 points of the model without it, and prints the
coefficient set for COEFFICIENTS; `--fit-named` fits only the latter. The table reports TEST (and the
real documents), never what the model was fitted on.

    .venv/bin/python -m bench.refusal --embedder multilingual-e5-small --squad path/to/squad-v1.1-dev.json \\
        --real-docs /tmp/real-docs-data --rows /tmp/refusal-rows.json --fit
    .venv/bin/python -m bench.refusal --from-rows /tmp/refusal-rows.json   # the table again, from the rows

The real documents are indexed first with
`RAG_DATA_DIR=/tmp/real-docs-data .venv/bin/python -m ingest.cli bench/real_docs/docs --recursive
--collection real-docs` (the embedder of the run: RAG_EMBED_MODEL).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _datasets as datasets
from bench._provenance import header
from bench.relevance_floor import Asked, _AllIndexed, _Embedder, _h, index_chunks, sample
from bench.relevance_floor import build as relevance_floor_build
from bench.retrieval_quality import EMBEDDERS, EmbeddingCache, embedder_folder, sentence_encoder
from rag.answering.coverage_rule import COEFFICIENTS, FEATURES, covered_probability, signals
from rag.answering.retrieval import RetrievedChunk, Retriever, relevance, relevance_floor
from rag.core.config import Settings

POSITIVES = ("squad+", "cmrc+", "one+", "real+")
GROUPS = {
    "squad+": "SQuAD, its article indexed (kept)",
    "squad-": "SQuAD, another article of the wiki (refused)",
    "squad-x": "SQuAD against the CMRC collection (refused)",
    "cmrc+": "CMRC, its article indexed (kept)",
    "cmrc-": "CMRC against the SQuAD collection (refused)",
    "one+": "one SQuAD article indexed, its questions (kept)",
    "one-": "one SQuAD article indexed, other articles' questions (refused)",
    "real+": "real documents, covered (kept)",
    "real-": "real documents, uncovered (refused)",
}
REAL_COLLECTION = "real-docs"
KEEP_WITHIN = 0.005  # each TRAIN positive group keeps at least the floor's share minus this


def split_of(article: str) -> str:
    """TRAIN or TEST, by a hash of the article's title (another hash than the one that halves SQuAD)."""
    return "train" if int(hashlib.sha1(f"refusal:{article}".encode()).hexdigest()[:8], 16) % 2 == 0 else "test"


def build(args: argparse.Namespace) -> tuple[dict[str, dict[str, tuple[str, str]]], dict[str, list[Asked]]]:
    """bench/relevance_floor.py's SQuAD (half the articles) and CMRC collections and questions, and
    single-topic collections: one indexed article each, asked its own questions and those of the other
    articles of its split (a small corpus on one subject)."""
    collections, asked = relevance_floor_build(args)
    squad = [q for q in asked["squad"] if q.kind in ("squad+", "squad-")]
    titles = sorted({q.article for q in squad if q.kind == "squad+"}, key=_h)[: args.topics]
    for title in titles:
        name = f"one-{_h(title):08x}"
        mine = [q for q in squad if q.kind == "squad+" and q.article == title][: args.topic_questions]
        article = str(mine[0].doc_id).split("-")[0]  # a paragraph's doc id is "s<article>-<paragraph>"
        collections[name] = {cid: held for cid, held in collections["squad"].items() if held[0].startswith(article)}
        others = [q for q in squad if q.article != title and split_of(q.article) == split_of(title)]
        asked[name] = [Asked("one+", q.text, q.answers, q.doc_id, title) for q in mine] + [
            Asked("one-", q.text, q.answers, None, title) for q in sample(others, args.topic_questions)
        ]
    return collections, asked


def row_of(kind: str, text: str, hits: Sequence[RetrievedChunk], settings: Settings, **extra: Any) -> dict:
    """One question's record: its signals and the floor's verdict over its hits."""
    good = [h for h in hits if h.score >= settings.min_score]
    floor = bool(good) and relevance(text, good, settings) >= relevance_floor(text, settings)
    # every hit as (cosine, coverage, dense rank, lexical rank, absent): the inputs of the signals
    inputs = [[h.cosine, h.coverage, h.dense_rank, h.lexical_rank, h.absent] for h in good]
    features = signals(text, good) if good else None
    unknown = list(good[0].unknown_names) if good else []  # names no chunk of the collection holds
    return {
        "kind": kind,
        "text": text,
        "floor": floor,
        "signals": features,
        "hits": inputs,
        "unknown": unknown,
        **extra,
    }


@dataclass
class _Recorded:
    """A hit as a row keeps it."""

    cosine: float | None
    coverage: float
    dense_rank: int | None
    lexical_rank: int | None
    absent: float


def refresh(rows: list[dict]) -> None:
    """The signals again from every row's recorded hits (the rule's signals may have changed since)."""
    for r in rows:
        r["signals"] = signals(r["text"], [_Recorded(*h[:5]) for h in r["hits"]]) if r["hits"] else None


def _found5(rank: int | None) -> bool:
    return rank is not None and rank <= 5


async def measure(chunks: dict, asked: dict[str, list[Asked]], embedder: _Embedder, workdir: Path, args) -> list[dict]:
    from rag.store.chroma_vectors import ChunkStore
    from rag.store.chunk_record import LexicalIndex

    settings = Settings(data_dir=workdir, embed_model=args.embedder)
    store = ChunkStore.open(settings)
    lexical = LexicalIndex(workdir / "lexical.sqlite")
    retriever = Retriever(embedder, store, lexical, _AllIndexed(), settings)
    rows = []
    for collection, held in chunks.items():
        index_chunks(store, lexical, collection, held, embedder)
        embedder.vectors([q.text for q in asked[collection]], "query")
        for q in asked[collection]:
            hits = await retriever.search(q.text, collection=collection, k=args.k)
            rank = next(
                (
                    r
                    for r, h in enumerate(hits, 1)
                    if h.doc_id == q.doc_id
                    and any(" ".join(a.lower().split()) in " ".join(h.text.lower().split()) for a in q.answers)
                ),
                None,
            )
            rows.append(row_of(q.kind, q.text, hits, settings, split=split_of(q.article), rank=rank))
    lexical.close()
    return rows


async def real_docs_rows(data_dir: Path, embedder_name: str, k: int) -> list[dict]:
    """bench/real_docs's questions against its corpus indexed in `data_dir`, through the stack's own parts."""
    from bench.real_docs.scoring import read_questions
    from ingest.embedder import embedder_for
    from rag.answering.ellipsis import whole_question
    from rag.answering.followup import rule_rewrite
    from rag.api.services import build_services

    base = Settings(data_dir=data_dir, embed_model=embedder_name)
    rows = []
    async with embedder_for(base, print, run="bench refusal") as settings:
        services = build_services(settings, owner="bench.refusal")
        try:
            retriever = Retriever(services.embedder, services.store, services.lexical, services.catalog, settings)
            for q in read_questions():
                history = [m for turn in q.history for m in ({"role": "user", "content": turn},)]
                asked = whole_question(history, q.question)
                query = asked if asked != q.question else rule_rewrite(history, q.question).text
                hits = await retriever.search(query, collection=REAL_COLLECTION, k=k)
                kind = "real-" if q.kind == "uncovered" else "real+"
                rows.append(row_of(kind, query, hits, settings, split="test", rank=None, id=q.id))
        finally:
            await services.aclose()
    return rows


def model_keeps(row: dict, coefficients: dict[str, float]) -> bool:
    if row["signals"] is None:
        return False
    return covered_probability(row["signals"], coefficients) >= coefficients["threshold"]


def named_keeps(row: dict, coefficients: dict[str, float]) -> bool:
    """The production verdict: a question with an unknown name (rag.answering.named_terms) must pass the
    model's `named_threshold`, the others its `threshold`."""
    if not row.get("unknown") or row["signals"] is None:
        return model_keeps(row, coefficients)
    return covered_probability(row["signals"], coefficients) >= coefficients.get("named_threshold", 0.0)


def fit_named(rows: Sequence[dict], coefficients: dict[str, float]) -> dict[str, float]:
    """The highest `named_threshold` that keeps each positive group of TRAIN within KEEP_WITHIN of what the
    model keeps without it (never under the model's own threshold)."""
    train = [r for r in rows if r["split"] == "train" and r["kind"] in ("squad+", "cmrc+", "one+")]
    groups = {kind: [r for r in train if r["kind"] == kind] for kind in ("squad+", "cmrc+", "one+")}
    kept = {kind: _share(group, lambda r: model_keeps(r, coefficients)) for kind, group in groups.items()}
    best = coefficients["threshold"]
    for step in range(1, 1000):
        candidate = coefficients | {"named_threshold": step / 1000}
        if candidate["named_threshold"] >= best and all(
            _share(group, lambda r: named_keeps(r, candidate)) >= kept[kind] - KEEP_WITHIN
            for kind, group in groups.items()
            if group
        ):
            best = candidate["named_threshold"]
    return coefficients | {"named_threshold": best}


def _share(rows: Sequence[dict], test: Callable[[dict], bool]) -> float:
    return sum(map(test, rows)) / len(rows) if rows else math.nan


def fit(rows: Sequence[dict]) -> dict[str, float]:
    """The logistic regression on TRAIN and its threshold; the coefficients on the raw features' scale."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    train = [r for r in rows if r["split"] == "train" and r["signals"] is not None and not r["kind"].startswith("real")]
    x = np.array([[r["signals"][f] for f in FEATURES] for r in train])
    y = np.array([r["kind"] in POSITIVES for r in train])
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    model = LogisticRegression(C=1.0, class_weight="balanced", max_iter=1000).fit((x - mean) / std, y)
    weights = model.coef_[0] / std
    coefficients = {"intercept": float(model.intercept_[0] - (weights * mean).sum())}
    coefficients |= {f: float(w) for f, w in zip(FEATURES, weights)}
    positives = {kind: [r for r in train if r["kind"] == kind] for kind in ("squad+", "cmrc+", "one+")}
    floors = {kind: _share(group, lambda r: r["floor"]) for kind, group in positives.items()}
    best = 0.0
    for step in range(1, 1000):
        t = step / 1000
        candidate = coefficients | {"threshold": t}
        if all(
            _share(group, lambda r: model_keeps(r, candidate)) >= floors[kind] - KEEP_WITHIN
            for kind, group in positives.items()
        ):
            best = t
    return fit_named(rows, {k: round(v, 4) for k, v in coefficients.items()} | {"threshold": best})


def report(rows: Sequence[dict], coefficients: dict[str, float] | None, embedder: str) -> str:
    lines = [f"embedder {embedder}; coefficients: {json.dumps(coefficients) if coefficients else 'none'}", ""]
    lines.append("| split | group | n | floor | model | model + unknown names |")
    lines.append("|---|---|---|---|---|---|")
    for split in ("train", "test"):
        for kind, what in GROUPS.items():
            group = [r for r in rows if r["split"] == split and r["kind"] == kind]
            if not group:
                continue
            sign = kind in POSITIVES

            def verdict(r: dict, by: Callable[[dict], bool] | None, sign: bool = sign) -> bool:
                keeps = r["floor"] if by is None else by(r)
                return keeps if sign else not keeps

            floor = _share(group, lambda r: verdict(r, None))
            model = (
                _share(group, lambda r: verdict(r, lambda x: model_keeps(x, coefficients)))
                if coefficients
                else math.nan
            )
            named = (
                _share(group, lambda r: verdict(r, lambda x: named_keeps(x, coefficients)))
                if coefficients
                else math.nan
            )
            lines.append(f"| {split} | {kind}: {what} | {len(group)} | {floor:.1%} | {model:.1%} | {named:.1%} |")
        squad = [r for r in rows if r["split"] == split and r["kind"] == "squad+"]
        if squad:
            r5 = _share(squad, lambda r: _found5(r["rank"]))
            floor5 = _share(squad, lambda r: _found5(r["rank"]) and r["floor"])
            model5 = _share(squad, lambda r: _found5(r["rank"]) and model_keeps(r, coefficients)) if coefficients else 0
            named5 = _share(squad, lambda r: _found5(r["rank"]) and named_keeps(r, coefficients)) if coefficients else 0
            lines.append(
                f"| {split} | SQuAD hybrid recall@5 (no refusal {r5:.3f}) | {len(squad)} | {floor5:.3f} | {model5:.3f} "
                f"| {named5:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=1000, help="questions per group (a fixed hash sample)")
    parser.add_argument("--topics", type=int, default=16, help="single-article collections (half TRAIN, half TEST)")
    parser.add_argument("--topic-questions", type=int, default=40, help="questions of each kind per article")
    parser.add_argument("--k", type=int, default=Settings().top_k, help="chunks retrieved per question (RAG_TOP_K)")
    parser.add_argument("--embedder", choices=EMBEDDERS, default=Settings().embed_model)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "rag-stack" / "bench")
    parser.add_argument("--real-docs", type=Path, help="a data dir holding bench/real_docs's corpus (`real-docs`)")
    parser.add_argument("--rows", type=Path, help="write every question's record here")
    parser.add_argument("--from-rows", type=Path, help="report on the records of an earlier run, measuring nothing")
    parser.add_argument("--fit", action="store_true", help="fit the coefficients on TRAIN and report with them")
    parser.add_argument(
        "--fit-named", action="store_true", help="fit only the named_threshold on TRAIN, the other coefficients kept"
    )
    datasets.add_options(parser, "squad", "cmrc")
    args = parser.parse_args(argv)
    print(header(), flush=True)
    if args.from_rows:
        saved = json.loads(args.from_rows.read_text(encoding="utf-8"))
        rows, args.embedder = saved["rows"], saved["embedder"]
        refresh(rows)
    else:
        datasets.use(args)
        args.model_path, prompts = embedder_folder(args.embedder)
        cache = EmbeddingCache(args.cache_dir / f"refusal-{args.embedder}.npz", sentence_encoder(args.model_path))
        embedder = _Embedder(cache, prompts)
        chunks, asked = build(args)
        with tempfile.TemporaryDirectory() as tmp:
            rows = asyncio.run(measure(chunks, asked, embedder, Path(tmp), args))
        if args.real_docs:
            rows += asyncio.run(real_docs_rows(args.real_docs, args.embedder, args.k))
        if args.rows:
            args.rows.write_text(json.dumps({"embedder": args.embedder, "rows": rows}), encoding="utf-8")
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    coefficients = fit(rows) if args.fit else COEFFICIENTS.get(args.embedder)
    if args.fit_named and coefficients and not args.fit:
        coefficients = fit_named(rows, dict(coefficients))
    print(report(rows, coefficients, args.embedder))


if __name__ == "__main__":
    main()
