"""Retrieval quality on SQuAD v1.1 dev (English) and CMRC 2018 trial (Chinese): dense, BM25 and hybrid.

Every paragraph is a document, chunked to ~200 tokens of the embedder's tokenizer; a question is answered
at rank r when the r-th chunk contains one of its gold answer texts. Prints recall@1/5/10 and MRR@10 for
dense, BM25, equal-weight RRF and the weighted score fusion of rag/answering/retrieval.py, tunes the dense weight on
the questions of one half (by a hash of the question id) and reports on the other half and on all.
The production path (Retriever.search, real Chroma on disk, the tantivy lexical index) is run on the held-out half
with the tuned weight to check that it gives the same numbers.

    .venv/bin/python -m bench.retrieval_quality                  # both sets, all questions
    .venv/bin/python -m bench.retrieval_quality --dataset cmrc --limit 300

Embeddings come from the embedder in-process (the model the embedding server serves: `--embedder`, the
bundled all-MiniLM-L6-v2 by default, or multilingual-e5-small with its `passage: ` / `query: ` prompts),
cached under --cache-dir keyed by a hash of each text, so re-runs skip the minutes of encoding.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import _datasets as datasets
from bench._provenance import header, write_json
from rag.answering.retrieval import Retriever, fuse
from rag.core.config import MULTILINGUAL_E5, Settings
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex, Tokenizer
from rag.store.vectors import VectorStore

DATASETS = ("squad", "cmrc")
COLLECTION = "bench"
KS = (1, 5, 10)
WEIGHTS = [round(0.05 * i, 2) for i in range(21)]
EMBEDDERS = ("all-MiniLM-L6-v2", MULTILINGUAL_E5)


@dataclass
class Question:
    qid: str
    text: str
    answers: list[str]


@dataclass
class Corpus:
    name: str
    chunks: dict[str, tuple[str, str]]  # chunk_id -> (doc_id, text)
    questions: list[Question]
    titles: dict[str, str]  # doc_id -> its article's title


@dataclass
class Runs:
    """Each question's candidate lists, (chunk_id, score) best first."""

    dense: list[list[tuple[str, float]]] = field(default_factory=list)
    dense_pgvector: list[list[tuple[str, float]]] = field(default_factory=list)  # with --pgvector
    lexical: dict[str, list[list[tuple[str, float]]]] = field(default_factory=dict)


# ---------------------------------------------------------------- data


def load_corpus(name: str, split: Callable[[str], list[str]], limit: int | None) -> Corpus:
    raw = datasets.read(name)
    chunks: dict[str, tuple[str, str]] = {}
    questions: list[Question] = []
    titles: dict[str, str] = {}
    n = 0
    for article in raw["data"]:
        for paragraph in article["paragraphs"]:
            doc_id = f"p{n:05d}"
            titles[doc_id] = article.get("title", "").replace("_", " ")
            n += 1
            for i, text in enumerate(split(paragraph["context"])):
                chunks[f"{doc_id}:{i}"] = (doc_id, text)
            for qa in paragraph["qas"]:
                answers = sorted({a["text"].strip() for a in qa["answers"] if a["text"].strip()})
                if answers:
                    questions.append(Question(qa["id"], qa["question"], answers))
    if limit:
        # A spread-out sample: the same for every run with the same limit.
        questions = sorted(questions, key=lambda q: _hash(q.qid))[:limit]
    return Corpus(name, chunks, questions, titles)


def make_splitter(model_path: str, chunk_tokens: int, overlap: int) -> Callable[[str], list[str]]:
    """The ingestion chunker, counting tokens with the embedder's own tokenizer."""
    import json

    from transformers import AutoTokenizer

    from ingest.chunking import Chunker

    max_sequence = json.loads((Path(model_path) / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    chunker = Chunker.from_tokenizer(tokenizer, chunk_tokens, overlap, max_sequence=max_sequence)
    return lambda text: [text[start:end] for start, end, _ in chunker.split(text)]


def embedder_folder(name: str) -> tuple[str, dict[str, str]]:
    """The embedder's sentence-transformers folder (multilingual-e5-small rebuilt on first use) and its prompts."""
    settings = Settings(embed_model=name)
    if name == MULTILINGUAL_E5:
        from rag.deploy.e5_rebuild import PROMPTS, ensure_e5_model

        return str(ensure_e5_model(settings)), PROMPTS
    return str(settings.embed_model_dir), {}


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- embeddings


class EmbeddingCache:
    """Vectors keyed by the sha1 of their text, in one .npz per model."""

    def __init__(self, path: Path, encode: Callable[[list[str]], np.ndarray]) -> None:
        self.path = path
        self._encode = encode
        self._vectors: dict[str, np.ndarray] = {}
        if path.exists():
            with np.load(path) as stored:
                self._vectors = dict(zip(stored["keys"].tolist(), stored["vectors"]))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [_hash(t) for t in texts]
        todo = sorted({k: t for k, t in zip(keys, texts) if k not in self._vectors}.items())
        if todo:
            started = time.perf_counter()
            vectors = self._encode([t for _, t in todo])
            self._vectors.update(zip([k for k, _ in todo], vectors))
            print(f"  encoded {len(todo)} texts in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            self._save()
        return np.stack([self._vectors[k] for k in keys])

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # another run may have added vectors meanwhile: keep them too
            with np.load(self.path) as stored:
                for key, vector in zip(stored["keys"].tolist(), stored["vectors"]):
                    self._vectors.setdefault(key, vector)
        keys = list(self._vectors)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=np.array(keys), vectors=np.stack([self._vectors[k] for k in keys]))
        tmp.replace(self.path)


def sentence_encoder(model_path: str) -> Callable[[list[str]], np.ndarray]:
    """The model's encode of texts that already carry their prompt (E5's `passage: ` or `query: `)."""
    model = None

    def encode(texts: list[str]) -> np.ndarray:
        nonlocal model
        if model is None:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(model_path, device="cpu", local_files_only=True)
        return model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)

    return encode


# ---------------------------------------------------------------- metrics


def first_hit(ranked: Iterable[str], corpus: Corpus, question: Question, depth: int = 10) -> int | None:
    for rank, chunk_id in enumerate(ranked, 1):
        if rank > depth:
            return None
        text = corpus.chunks[chunk_id][1]
        if any(answer in text for answer in question.answers):
            return rank
    return None


def metrics(ranks: Sequence[int | None]) -> dict[str, float]:
    n = max(len(ranks), 1)
    out = {f"R@{k}": sum(r is not None and r <= k for r in ranks) / n for k in KS}
    out["MRR"] = sum(1 / r for r in ranks if r is not None) / n
    return out


def rrf(dense: Sequence[tuple[str, float]], lexical: Sequence[tuple[str, float]], k: int = 60) -> list[str]:
    scores: dict[str, float] = {}
    for hits in (dense, lexical):
        for rank, (chunk_id, _) in enumerate(hits, 1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1 / (k + rank)
    return sorted(scores, key=lambda c: -scores[c])


# ---------------------------------------------------------------- runs


POSTGRES = " (PostgreSQL)"


def build_indexes(
    corpus: Corpus,
    vectors: np.ndarray,
    workdir: Path,
    variants: dict[str, tuple[Tokenizer, bool]],
    database_url: str | None = None,
    pgvector: bool = False,
):
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    client = chromadb.PersistentClient(
        path=str(workdir / "chroma"), settings=ChromaSettings(anonymized_telemetry=False)
    )
    store = ChunkStore(client)
    ids = list(corpus.chunks)
    metadatas = [{"doc_id": corpus.chunks[i][0], "chunk_index": int(i.rsplit(":", 1)[1])} for i in ids]
    store.upsert(COLLECTION, ids, vectors.tolist(), [corpus.chunks[i][1] for i in ids], metadatas)
    pg_store = None
    if pgvector:  # the same vectors in pgvector (rag/store/pg_vectors.py), in RAG_DATABASE_URL's database
        from rag.store.pg_vectors import PgVectorStore

        assert database_url is not None
        pg_store = PgVectorStore(database_url)
        pg_store.delete_collection(COLLECTION)
        pg_store.upsert(COLLECTION, ids, vectors, [corpus.chunks[i][1] for i in ids], metadatas)
    lexicals = {}
    for name, (tokenizer, with_title) in variants.items():
        rows = [(i, d, text, corpus.titles[d] if with_title else "") for i, (d, text) in corpus.chunks.items()]
        started = time.perf_counter()
        if name.endswith(
            POSTGRES
        ):  # the record in PostgreSQL, a replica's index following it (rag/store/pg_lexical.py)
            from rag.store.pg_lexical import PgLexicalIndex

            assert database_url is not None
            lexicals[name] = PgLexicalIndex(database_url, workdir / "lexical-pg", tokenizer)  # type: ignore[assignment]
            lexicals[name].delete_collection(COLLECTION)
        else:
            lexicals[name] = LexicalIndex(workdir / f"lexical-{name}.sqlite", tokenizer)
        lexicals[name].add(COLLECTION, rows)
        print(f"  lexical {name}: indexed {len(rows)} chunks in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return store, lexicals, pg_store


def collect_runs(
    corpus: Corpus,
    qvectors: np.ndarray,
    store: ChunkStore,
    lexicals: dict[str, LexicalIndex],
    depth: int,
    pg_store: VectorStore | None = None,
) -> Runs:
    runs = Runs(lexical={name: [] for name in lexicals})
    for question, vector in zip(corpus.questions, qvectors):
        hits = store.query(COLLECTION, vector.tolist(), depth)
        runs.dense.append([(h.id, h.score) for h in hits])
        if pg_store is not None:
            runs.dense_pgvector.append([(h.id, h.score) for h in pg_store.query(COLLECTION, vector.tolist(), depth)])
        for name, index in lexicals.items():
            runs.lexical[name].append([(h.chunk_id, h.score) for h in index.search(COLLECTION, question.text, depth)])
    return runs


def evaluate(corpus: Corpus, rankings: Iterable[Sequence[str]], subset: Sequence[int]) -> dict[str, float]:
    rankings = list(rankings)
    return metrics([first_hit(rankings[i], corpus, corpus.questions[i]) for i in subset])


def tune_weight(corpus: Corpus, runs: Runs, lexical: str, subset: Sequence[int]) -> tuple[float, dict[float, dict]]:
    """The dense weight with the best R@1 + R@5 on `subset` (both are targets), ties to the smaller weight."""
    table = {}
    for w in WEIGHTS:
        fused = ([c for c, _ in fuse(d, lex, w)] for d, lex in zip(runs.dense, runs.lexical[lexical]))
        table[w] = evaluate(corpus, fused, subset)
    best = max(WEIGHTS, key=lambda w: (round(table[w]["R@5"] + table[w]["R@1"], 4), -w))
    return best, table


class _CachedEmbedder:
    """The query vectors computed above, served through the Embedder protocol."""

    def __init__(self, corpus: Corpus, vectors: np.ndarray) -> None:
        self._by_text = {q.text: v for q, v in zip(corpus.questions, vectors)}

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        return [self._by_text[t].tolist() for t in texts]


class _AllIndexed:
    def indexed_names(self, collection: str, doc_ids: Iterable[str]) -> dict[str, str]:
        return dict.fromkeys(doc_ids, "")


async def production_check(
    corpus: Corpus,
    qvectors: np.ndarray,
    store: VectorStore,
    lexical: LexicalIndex,
    weights: tuple[float, float],
    subset: Sequence[int],
    workdir: Path,
) -> dict[str, float]:
    settings = Settings(data_dir=workdir, hybrid_dense_weight=weights[0], hybrid_dense_weight_cjk=weights[1])
    retriever = Retriever(_CachedEmbedder(corpus, qvectors), store, lexical, _AllIndexed(), settings)
    ranks = []
    for i in subset:
        question = corpus.questions[i]
        found = await retriever.search(question.text, collection=COLLECTION, k=10)
        ranks.append(first_hit([c.chunk_id for c in found], corpus, question))
    return metrics(ranks)


# ---------------------------------------------------------------- report


def row(name: str, m: dict[str, float]) -> str:
    return f"  {name:<34} " + "  ".join(f"{m[key]:.3f}" for key in (*(f"R@{k}" for k in KS), "MRR"))


def table_header() -> str:
    return f"  {'method':<34} " + "  ".join(f"{key:>5}" for key in (*(f"R@{k}" for k in KS), "MRR"))


def run_dataset(name: str, args: argparse.Namespace, split, encode, prompts: dict[str, str]) -> dict:
    print(f"\n== {name}", file=sys.stderr)
    corpus = load_corpus(name, split, args.limit)
    cache = EmbeddingCache(args.cache_dir / f"{args.embedder}.npz", encode)
    chunk_texts = [text for _, text in corpus.chunks.values()]
    lengths = [len(t) for t in chunk_texts]
    print(
        f"  {len(corpus.chunks)} chunks (median {statistics.median(lengths):.0f} chars), "
        f"{len(corpus.questions)} questions",
        file=sys.stderr,
    )
    vectors = cache.embed([prompts.get("passage", "") + t for t in chunk_texts])
    qvectors = cache.embed([prompts.get("query", "") + q.text for q in corpus.questions])
    # BM25 variants: the tokenizer, and whether the article's title is indexed with each chunk (the
    # pipeline's chunk context: a document title or heading path).
    variants = {
        "stem+stop+title": (Tokenizer(), True),
        "stem+stop": (Tokenizer(), False),
        "stop": (Tokenizer(stem=False), False),
        "plain": (Tokenizer(stem=False, stopwords=False), False),
    }
    fused_over: tuple[str, ...] = ("stem+stop", "stem+stop+title")
    if args.postgres:
        variants["stem+stop+title" + POSTGRES] = (Tokenizer(), True)
        fused_over += ("stem+stop+title" + POSTGRES,)
    with tempfile.TemporaryDirectory(prefix="rag-bench-") as tmp:
        workdir = Path(tmp)
        store, lexicals, pg_store = build_indexes(corpus, vectors, workdir, variants, args.postgres, args.pgvector)
        started = time.perf_counter()
        runs = collect_runs(corpus, qvectors, store, lexicals, args.depth, pg_store)
        print(f"  retrieved in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        everyone = range(len(corpus.questions))
        tune = [i for i in everyone if int(_hash(corpus.questions[i].qid), 16) % 2 == 0]
        held = [i for i in everyone if int(_hash(corpus.questions[i].qid), 16) % 2 == 1]
        tuned = {lex: tune_weight(corpus, runs, lex, tune) for lex in fused_over}
        results: dict = {
            "tuned_dense_weight": {lex: best for lex, (best, _) in tuned.items()},
            "sweep": {lex: {str(w): m for w, m in t.items()} for lex, (_, t) in tuned.items()},
            "methods": {},
            "production_check_held_out": {},
        }
        methods: dict[str, Callable[[int], Sequence[str]]] = {
            f"dense ({args.embedder}, Chroma cosine)": lambda i: [c for c, _ in runs.dense[i]]
        }
        for lex in variants:
            methods[f"BM25 ({lex})"] = lambda i, lex=lex: [c for c, _ in runs.lexical[lex][i]]
        for lex in fused_over:
            methods[f"RRF k=60 equal, {lex}"] = lambda i, lex=lex: rrf(runs.dense[i], runs.lexical[lex][i])
            fixed = args.cjk_weight if name == "cmrc" else args.weight
            for w in sorted({tuned[lex][0], fixed}):
                methods[f"hybrid w={w:.2f}, {lex}"] = lambda i, w=w, lex=lex: [
                    c for c, _ in fuse(runs.dense[i], runs.lexical[lex][i], w)
                ]
            if pg_store is not None:
                methods[f"hybrid w={fixed:.2f}, {lex}, pgvector"] = lambda i, w=fixed, lex=lex: [
                    c for c, _ in fuse(runs.dense_pgvector[i], runs.lexical[lex][i], w)
                ]
        if pg_store is not None:
            methods[f"dense ({args.embedder}, pgvector cosine)"] = lambda i: [c for c, _ in runs.dense_pgvector[i]]
        for part, subset in (("tuning half", tune), ("held-out half", held), ("all", list(everyone))):
            print(f"\n{name}: {part} ({len(subset)} questions)\n{table_header()}")
            for method, ranked in methods.items():
                m = evaluate(corpus, (ranked(i) for i in everyone), subset)
                results["methods"].setdefault(part, {})[method] = m
                print(row(method, m))
        for lex in fused_over:
            weights = (args.weight, args.cjk_weight)
            check = asyncio.run(production_check(corpus, qvectors, store, lexicals[lex], weights, held, workdir))
            results["production_check_held_out"][lex] = check
            print(row(f"Retriever.search held-out, {lex}", check))
            if pg_store is not None:
                check = asyncio.run(production_check(corpus, qvectors, pg_store, lexicals[lex], weights, held, workdir))
                results["production_check_held_out"][f"{lex}, pgvector"] = check
                print(row(f"Retriever.search held-out, {lex}, pgvector", check))
        for lex, (best, table) in tuned.items():
            print(f"\n  dense weight sweep, {lex}, tuning half (R@1 / R@5); best {best:.2f}:")
            print("  " + "  ".join(f"{w:.2f}:{m['R@1']:.3f}/{m['R@5']:.3f}" for w, m in table.items()))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", nargs="+", choices=sorted(DATASETS), default=sorted(DATASETS, reverse=True))
    parser.add_argument("--limit", type=int, default=None, help="questions per set (a fixed hash-spread sample)")
    parser.add_argument("--depth", type=int, default=50, help="candidates per method (RAG_RETRIEVAL_DEPTH)")
    parser.add_argument("--chunk-tokens", type=int, default=200)
    parser.add_argument("--overlap", type=int, default=32)
    defaults = Settings()
    parser.add_argument(
        "--weight",
        type=float,
        default=defaults.hybrid_dense_weight,
        help="the dense weight of the production check (default: RAG_HYBRID_DENSE_WEIGHT's)",
    )
    parser.add_argument(
        "--cjk-weight",
        type=float,
        default=defaults.hybrid_dense_weight_cjk,
        help="the CJK dense weight of the production check (default: RAG_HYBRID_DENSE_WEIGHT_CJK's)",
    )
    parser.add_argument(
        "--embedder", choices=EMBEDDERS, default=defaults.embed_model, help="[default: RAG_EMBED_MODEL]"
    )
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "rag-stack" / "bench")
    parser.add_argument("--json", type=Path, default=None, help="write all numbers here")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        default=None,
        help="also run BM25 from PostgreSQL (a postgresql:// URL; its collection of this name is replaced)",
    )
    parser.add_argument(
        "--pgvector",
        action="store_true",
        help="with --postgres: also search the same vectors in pgvector there (RAG_VECTOR_STORE=pgvector)",
    )
    datasets.add_options(parser, "squad", "cmrc")
    args = parser.parse_args(argv)
    if args.pgvector and not args.postgres:
        parser.error("--pgvector needs --postgres URL")
    datasets.use(args)
    print(header(), flush=True)

    model_path, prompts = embedder_folder(args.embedder)
    split = make_splitter(model_path, args.chunk_tokens, args.overlap)
    encode = sentence_encoder(model_path)
    results = {name: run_dataset(name, args, split, encode, prompts) for name in args.dataset}
    results["embedder"] = args.embedder
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
