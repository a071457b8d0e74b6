"""The packing cut-off's curve: new prompt tokens vs recall of the answer-bearing chunk in the prompt.

A full-budget answer (top_k 16) packs every retrieved source that fits, and prefill time grows with the
tokens packed (~2,100 tok/s on an H200 machine for the production model's shape). RAG_PACK_RELATIVE_SCORE
stops adding sources whose fused score falls below that share of the best one. On SQuAD dev (every
paragraph a document, ~200-token chunks, the real Retriever over Chroma and BM25), for each share this
prints the source tokens packed into a 4,096-token context (per source: its tokens + a label) and the share
of questions whose prompt still holds a chunk with a gold answer, so the default is chosen from numbers.

    .venv/bin/python -m bench.packing_cutoff --limit 1000 --json bench/results/packing_cutoff.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench.retrieval_quality import (
    COLLECTION,
    EmbeddingCache,
    _AllIndexed,
    _CachedEmbedder,
    build_indexes,
    load_corpus,
    make_splitter,
    sentence_encoder,
)
from rag.answering.retrieval import Retriever
from rag.core.config import Settings
from rag.store.chunk_record import Tokenizer

SHARES = [0.0, 0.1, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8]
LABEL_TOKENS = 12  # "[S3] source: title\n" and the separator around each source
SOURCE_BUDGET = 2_900  # 4,096 - 512 for the answer - the system prompt, question and template (measured: ~2,980)


def pack(hits: list[tuple[str, float, int]], share: float, budget: int) -> list[str]:
    """Source ids packed in rank order: above share x best score, while they fit."""
    best = hits[0][1] if hits else 0.0
    packed, used = [], 0
    for chunk_id, score, tokens in hits:
        if score < share * best:
            break
        if used + tokens + LABEL_TOKENS > budget:
            continue
        packed.append(chunk_id)
        used += tokens + LABEL_TOKENS
    return packed


async def retrieve(corpus, qvectors, store, lexical, workdir: Path, k: int) -> list[list[tuple[str, float]]]:
    retriever = Retriever(_CachedEmbedder(corpus, qvectors), store, lexical, _AllIndexed(), Settings(data_dir=workdir))
    return [
        [(c.chunk_id, c.score) for c in await retriever.search(q.text, collection=COLLECTION, k=k)]
        for q in corpus.questions
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=1000, help="questions (a fixed spread-out sample)")
    parser.add_argument("--top-k", type=int, default=16)
    parser.add_argument("--budget", type=int, default=SOURCE_BUDGET, help="tokens for the sources")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "rag-stack" / "bench")
    parser.add_argument("--json", type=Path, default=None)
    datasets.add_options(parser, "squad")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)

    from transformers import AutoTokenizer

    model_path = str(Settings().embed_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    corpus = load_corpus("squad", make_splitter(model_path, 200, 32), args.limit)
    cache = EmbeddingCache(args.cache_dir / "all-MiniLM-L6-v2.npz", sentence_encoder(model_path))
    vectors = cache.embed([text for _, text in corpus.chunks.values()])
    qvectors = cache.embed([q.text for q in corpus.questions])
    with tempfile.TemporaryDirectory(prefix="rag-cutoff-") as tmp:
        store, lexicals = build_indexes(corpus, vectors, Path(tmp), {"stem+stop+title": (Tokenizer(), True)})
        runs = asyncio.run(retrieve(corpus, qvectors, store, lexicals["stem+stop+title"], Path(tmp), args.top_k))
    tokens = {
        cid: len(tokenizer(text, add_special_tokens=False)["input_ids"]) for cid, (_, text) in corpus.chunks.items()
    }
    curve = []
    for share in SHARES:
        packed = [pack([(c, s, tokens[c]) for c, s in hits], share, args.budget) for hits in runs]
        found = [
            any(any(a in corpus.chunks[c][1] for a in q.answers) for c in ids)
            for q, ids in zip(corpus.questions, packed)
        ]
        used = [sum(tokens[c] + LABEL_TOKENS for c in ids) for ids in packed]
        curve.append(
            {
                "share": share,
                "recall": round(sum(found) / len(found), 4),
                "tokens_mean": round(statistics.mean(used)),
                "tokens_median": statistics.median(used),
                "sources_mean": round(statistics.mean(len(ids) for ids in packed), 2),
            }
        )
    base = curve[0]
    print(f"SQuAD dev, {len(corpus.questions)} questions, top_k {args.top_k}, {args.budget} source tokens")
    print(f"{'share':>6} {'recall':>7} {'vs 0':>6} {'tokens (mean)':>14} {'median':>7} {'sources':>8}")
    for row in curve:
        print(
            f"{row['share']:6.2f} {row['recall']:7.4f} {row['recall'] - base['recall']:+6.4f} "
            f"{row['tokens_mean']:14d} {row['tokens_median']:7.0f} {row['sources_mean']:8.2f}"
        )
    if args.json:
        write_json(
            args.json, {"questions": len(corpus.questions), "top_k": args.top_k, "budget": args.budget, "curve": curve}
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
