"""Evaluation on a SQuAD-format question set: retrieval per method, answers, citations, timings.

    evalset = read_squad(path, limit=200, seed=0)
    result = await Evaluation(parts, settings, options, progress).run(evalset)
    write_report(result, Path("eval-report"))
    regressions = compare(result["scores"], baseline["scores"], max_drop=0.02)

Every paragraph (`context`) of the set is one document, ingested through the normal pipeline (load,
chunk, embed, store, catalog), so the numbers are those of the configured chunking and embedder.

Retrieval: a question is found at rank r when the r-th chunk that `Retriever.search` returns is an
*answer-bearing chunk*: a chunk of the question's own paragraph whose text contains one of the gold
answer texts (case-folded, whitespace collapsed). A chunk of another paragraph that happens to contain
"1990" does not count. A question whose paragraph has no such chunk (the answer was cut across two
chunks) cannot be found by any method: it is counted apart and left out of the recall. Recall@k is
the share of questions found at rank <= k; MRR is the mean of 1/rank over the first 10 results.

Answers (optional): each question goes through the answering core (`Answerer`, the one behind
/v1/chat) with the configured top_k. Exact match and F1 follow the SQuAD script: lower-case, strip
punctuation and the articles a/an/the, collapse whitespace, take the best over the gold answers; the
[Sn] citation markers are removed first. Text with CJK characters is scored per character (CMRC's
mixed segmentation: CJK characters one by one, other words whole). Citation precision is the share
of the model's valid citations whose chunk is answer-bearing, pooled over all answers;
`no_valid_citation` is the share of answers citing no source that was in their prompt (the fixed "no
sources" answer included). Attribution precision is the same share for the attributed chunks (found
per answer sentence after generation); `attributed_holds_answer` the share of attributed chunks that
hold the answer as the model wrote it (was the right chunk found for what was said);
`supported_source` the share of answers with a model-cited or attributed chunk that is answer-bearing;
`unsupported_sentences` the share of answer sentences no chunk supports; `at_token_limit` the share of
answers cut by max_tokens.

`scores` is the flat dict of gated metrics; all are better higher except those in LOWER_IS_BETTER.
`provenance` (the commit or version, the date, the machine and its load average as the run started) and
`config` (the settings that shape the numbers) say what produced them; the gate compares `scores` only.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
import time
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rag.core.config import Settings
from rag.core.errors import InvalidRequest
from rag.core.provenance import provenance, summary

KS = (1, 5, 10)
DEPTH = 10  # results looked at per question: recall@10 and MRR@10
MODES = ("dense", "lexical", "hybrid")
LOWER_IS_BETTER = frozenset({"answers.no_valid_citation"})


# ---------------------------------------------------------------- the question set


@dataclass(frozen=True)
class EvalQuestion:
    qid: str
    question: str
    answers: tuple[str, ...]
    context: int  # index of its paragraph in EvalSet.contexts


@dataclass
class EvalSet:
    name: str
    sha256: str
    contexts: dict[int, str]  # paragraph number in the file -> text (only those of the chosen questions)
    questions: list[EvalQuestion]
    total_questions: int
    total_contexts: int


def read_squad(path: Path, *, limit: int | None = None, seed: int = 0) -> EvalSet:
    """The questions of a SQuAD-format file.

    With `limit`: whole articles in a seeded order until they hold `limit` questions and at least
    limit/2 paragraphs, then a seeded sample of `limit` of their questions; only those articles'
    paragraphs are indexed. The other paragraphs of an article share its topic, so they are the hard
    distractors of a real collection, and a quick run does not saturate at recall 1.
    """
    raw = path.read_bytes()
    try:
        articles = [_article(a) for a in json.loads(raw)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"{path} is not SQuAD JSON (data[].paragraphs[].qas[]): {exc}") from None
    contexts: dict[int, str] = {}
    questions: list[EvalQuestion] = []
    by_article: list[tuple[dict[int, str], list[EvalQuestion]]] = []
    for paragraphs in articles:
        mine: dict[int, str] = {}
        asked: list[EvalQuestion] = []
        for text, qas in paragraphs:
            number = len(contexts)
            contexts[number] = mine[number] = text
            asked += [EvalQuestion(qid or f"q{len(questions) + len(asked)}", q, answers, number) for qid, q, answers in qas]
        questions += asked
        by_article.append((mine, asked))
    total_q, total_c = len(questions), len(contexts)
    if limit is not None and limit < len(questions):
        contexts, questions = _sample(by_article, limit, seed)
    if not questions:
        raise InvalidRequest(f"{path} holds no question with an answer text")
    return EvalSet(path.stem, hashlib.sha256(raw).hexdigest(), contexts, questions, total_q, total_c)


def _article(article: dict[str, Any]) -> list[tuple[str, list[tuple[str, str, tuple[str, ...]]]]]:
    """An article's paragraphs as (context, [(id, question, answer texts)]), questions without answers left out."""
    paragraphs = []
    for paragraph in article["paragraphs"]:
        qas = []
        for qa in paragraph.get("qas", []):
            answers = tuple(dict.fromkeys(a["text"].strip() for a in qa.get("answers", []) if a["text"].strip()))
            if answers and qa["question"].strip():
                qas.append((str(qa.get("id", "")), qa["question"], answers))
        paragraphs.append((paragraph["context"], qas))
    return paragraphs


def _sample(
    by_article: list[tuple[dict[int, str], list[EvalQuestion]]], limit: int, seed: int
) -> tuple[dict[int, str], list[EvalQuestion]]:
    rng = random.Random(seed)
    order = list(range(len(by_article)))
    rng.shuffle(order)
    contexts: dict[int, str] = {}
    pool: list[EvalQuestion] = []
    for i in order:
        if len(pool) >= limit and len(contexts) >= limit / 2:
            break
        contexts.update(by_article[i][0])
        pool += by_article[i][1]
    return contexts, rng.sample(pool, min(limit, len(pool)))


# ---------------------------------------------------------------- metrics

_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CITATION = re.compile(r"[\[【［]\s*S\d+(?:\s*[,，;；]\s*S\d+)*\s*[\]】］]", re.IGNORECASE)
_CJK_PUNCT = set("，。！？；：、“”‘’（）《》【】〈〉「」『』…—～·")


def _is_punct(ch: str) -> bool:
    return ch in string.punctuation or ch in _CJK_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower-case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if not _is_punct(ch))
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_tokens(text: str) -> list[str]:
    """Words of the normalized text; CJK characters count one by one."""
    tokens: list[str] = []
    for word in normalize_answer(text).split():
        if _CJK.search(word):
            tokens.extend(re.findall(rf"{_CJK.pattern}|[^{_CJK.pattern[1:-1]}]+", word))
        else:
            tokens.append(word)
    return tokens


def strip_citations(text: str) -> str:
    return " ".join(_CITATION.sub(" ", text).split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    pred = " ".join(answer_tokens(prediction))
    return float(any(pred == " ".join(answer_tokens(g)) for g in golds))


def token_f1(prediction: str, golds: Iterable[str]) -> float:
    """The best token F1 of `prediction` against any gold answer."""
    from collections import Counter

    pred = answer_tokens(prediction)
    best = 0.0
    for gold in golds:
        ref = answer_tokens(gold)
        common = sum((Counter(pred) & Counter(ref)).values())
        if common:
            precision, recall = common / len(pred), common / len(ref)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _folded(text: str) -> str:
    return " ".join(text.casefold().split())


def bears_answer(chunk_text: str, chunk_doc: str, question_doc: str, answers: Iterable[str]) -> bool:
    """Whether a chunk of `chunk_doc` is answer-bearing for a question of `question_doc`."""
    if chunk_doc != question_doc:
        return False
    text = _folded(chunk_text)
    return any(_folded(answer) in text for answer in answers)


def rank_metrics(ranks: Sequence[int | None], depth: int = DEPTH) -> dict[str, Any]:
    """recall@1/5/10, MRR and the recall@k curve for k = 1..depth, from each question's first-hit rank."""
    n = max(len(ranks), 1)
    curve = [sum(r is not None and r <= k for r in ranks) / n for k in range(1, depth + 1)]
    out: dict[str, Any] = {f"recall@{k}": curve[k - 1] for k in KS if k <= depth}
    out["mrr"] = sum(1 / r for r in ranks if r is not None and r <= depth) / n
    out["curve"] = curve
    return out


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99, mean and max in milliseconds (empty: {})."""
    if not values_ms:
        return {}
    import numpy as np

    arr = np.asarray(values_ms, dtype=float)
    return {
        "n": int(arr.size),
        "p50": round(float(np.percentile(arr, 50)), 2),
        "p95": round(float(np.percentile(arr, 95)), 2),
        "p99": round(float(np.percentile(arr, 99)), 2),
        "mean": round(float(arr.mean()), 2),
        "max": round(float(arr.max()), 2),
    }


# ---------------------------------------------------------------- the regression gate


@dataclass
class Regression:
    metric: str
    baseline: float
    current: float

    @property
    def drop(self) -> float:
        """How much worse than the baseline (positive: worse), whichever way the metric points."""
        delta = self.baseline - self.current
        return -delta if self.metric in LOWER_IS_BETTER else delta

    def line(self) -> str:
        return f"{self.metric}: {self.baseline:.4f} -> {self.current:.4f} (worse by {self.drop:.4f})"


def compare(current: dict[str, float], baseline: dict[str, float], max_drop: float) -> list[Regression]:
    """The metrics measured in both runs that got worse than the baseline by more than `max_drop` (absolute)."""
    checks = [Regression(m, float(b), float(current[m])) for m, b in sorted(baseline.items()) if m in current]
    return [c for c in checks if c.drop > max_drop + 1e-9]


def unmeasured(current: dict[str, float], baseline: dict[str, float]) -> list[str]:
    """Metrics of the baseline that this run did not measure (other --modes, no --answers)."""
    return sorted(set(baseline) - set(current))


def read_baseline(path: Path) -> dict[str, Any]:
    try:
        baseline = json.loads(path.read_text(encoding="utf-8"))
        baseline["scores"]  # noqa: B018 - shape check
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"{path} is not the --json output of rag eval: {exc}") from None
    return baseline


def sample_differs(result: dict[str, Any], baseline: dict[str, Any]) -> str | None:
    """Why the two runs did not ask the same questions, if they did not."""
    a, b = result.get("dataset", {}), baseline.get("dataset", {})
    for key in ("sha256", "limit", "seed"):
        if a.get(key) != b.get(key):
            return f"the baseline ran with {key}={b.get(key)!r}, this run with {a.get(key)!r}"
    return None


# ---------------------------------------------------------------- the run


class Parts(Protocol):
    """What a run needs: rag.api.services.Services has all of it."""

    settings: Settings
    llm: Any
    embedder: Any
    store: Any
    lexical: Any
    catalog: Any

    def pipeline(self) -> Any: ...


class EvalProgress(Protocol):
    def stage(self, name: str, total: int) -> None: ...
    def advance(self, n: int = 1) -> None: ...


class NoEvalProgress:
    def stage(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass
class EvalOptions:
    collection: str | None = None  # None: a fresh one, removed at the end unless keep
    keep: bool = False
    modes: tuple[str, ...] = MODES
    answers: bool = False
    max_tokens: int | None = None  # None: the prompt style's default
    limit: int | None = None
    seed: int = 0


class QueryVectors:
    """The embedder for the retriever: each question is embedded once (timed) and reused by every method."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self._memo: dict[str, Sequence[float]] = {}

    async def prime(self, text: str) -> float:
        """Embed `text` now; the milliseconds it took."""
        self._memo.clear()
        started = time.perf_counter()
        self._memo[text] = (await self.embedder.embed([text]))[0]
        return (time.perf_counter() - started) * 1000

    async def embed(self, texts: list[str]) -> list[Sequence[float]]:
        if len(self._memo) > 64:  # answering asks one question after another: stay small
            self._memo.clear()
        missing = [t for t in texts if t not in self._memo]
        if missing:
            self._memo.update(zip(missing, await self.embedder.embed(missing)))
        return [self._memo[t] for t in texts]


class _IngestProgress:
    """The pipeline's progress protocol, fed into the run's progress bar."""

    def __init__(self, progress: EvalProgress) -> None:
        self.progress = progress

    def file_started(self, file: Any) -> None:
        pass

    def chunks_stored(self, n: int) -> None:
        pass

    def file_done(self, result: Any) -> None:
        self.progress.advance()


@dataclass
class _QuestionRun:
    question: EvalQuestion
    doc_id: str
    ranks: dict[str, int | None] = field(default_factory=dict)


def fresh_collection_name(evalset: EvalSet) -> str:
    stem = re.sub(r"[^A-Za-z0-9]+", "-", evalset.name).strip("-")[:40] or "set"
    return f"eval-{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{evalset.sha256[:6]}"


class Evaluation:
    """One evaluation run over the given parts (store, embedder, llama-server) and settings."""

    def __init__(self, parts: Parts, settings: Settings, options: EvalOptions,
                 progress: EvalProgress | None = None) -> None:
        for mode in options.modes:
            if mode not in MODES:
                raise InvalidRequest(f"unknown retrieval mode {mode!r}", modes=list(MODES))
        self.parts = parts
        self.settings = settings
        self.options = options
        self.progress = progress or NoEvalProgress()
        self.collection = options.collection or ""

    async def run(self, evalset: EvalSet) -> dict[str, Any]:
        from rag.answering.retrieval import Retriever

        started = time.time()
        origin = provenance()  # before the run: its load average is what competed with the run, not the run
        fresh = self.options.collection is None
        self.collection = self.options.collection or fresh_collection_name(evalset)
        vectors = QueryVectors(self.parts.embedder)
        retriever = Retriever(vectors, self.parts.store, self.parts.lexical, self.parts.catalog, self.settings)
        try:
            ingest, doc_of = await self._ingest(evalset)
            runs = [_QuestionRun(q, doc_of[q.context]) for q in evalset.questions if q.context in doc_of]
            retrieval = await self._retrieve(runs, retriever, vectors)
            answers = await self._answer(runs, retriever) if self.options.answers else None
        finally:
            await retriever.aclose()
            if fresh and not self.options.keep:
                await self._drop_collection()
        result = {
            "provenance": origin,
            "dataset": self._dataset_info(evalset),
            "config": self._config(fresh),
            "ingest": ingest,
            "retrieval": retrieval,
            "answers": answers,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "elapsed_s": round(time.time() - started, 1),
        }
        result["scores"] = flat_scores(result)
        return result

    def _dataset_info(self, evalset: EvalSet) -> dict[str, Any]:
        return {
            "name": evalset.name, "sha256": evalset.sha256, "limit": self.options.limit, "seed": self.options.seed,
            "questions": len(evalset.questions), "contexts": len(evalset.contexts),
            "total_questions": evalset.total_questions, "total_contexts": evalset.total_contexts,
        }

    def _config(self, fresh: bool) -> dict[str, Any]:
        s = self.settings
        return {
            "collection": self.collection, "fresh_collection": fresh, "kept": (not fresh) or self.options.keep,
            "chunk_tokens": s.chunk_tokens, "chunk_overlap": s.chunk_overlap, "top_k": s.top_k,
            "hybrid_dense_weight": s.hybrid_dense_weight, "hybrid_dense_weight_cjk": s.hybrid_dense_weight_cjk,
            "retrieval_depth": s.retrieval_depth, "reranker": bool(s.reranker_url), "min_score": s.min_score,
            "embed_model": s.embed_model, "embed_url": s.embed_url, "llm_model": s.llm_model,
            "llm_url": s.llm_url if self.options.answers else None, "max_tokens": self.options.max_tokens,
            "chroma_mode": s.chroma_mode, "modes": list(self.options.modes),
            "llm_prompt_style": s.llm_prompt_style, "completion_max_tokens": s.completion_max_tokens,
            "completion_max_sources": s.completion_max_sources,
            "embed_model_path": s.embed_model_path, "rerank_depth": s.rerank_depth,
            "min_relevance": s.min_relevance, "min_relevance_cjk": s.min_relevance_cjk,
            "context_budget": s.context_budget, "answer_reserve": s.answer_reserve,
            "pack_relative_score": s.pack_relative_score,
        }

    # Ingestion.

    async def _ingest(self, evalset: EvalSet) -> tuple[dict[str, Any], dict[int, str]]:
        """Index the contexts as documents; the ingest summary and each context's document id."""
        import tempfile

        from ingest.pipeline import SourceFile

        self.progress.stage("ingest", len(evalset.contexts))
        with tempfile.TemporaryDirectory(prefix="rag-eval-") as tmp:
            files, numbers = [], []
            for number, text in sorted(evalset.contexts.items()):
                name = f"{evalset.name}-{number:05d}.txt"
                path = Path(tmp) / name
                path.write_text(text, encoding="utf-8")
                files.append(SourceFile(path, name, name))
                numbers.append(number)
            started = time.perf_counter()
            results = await self.parts.pipeline().run(files, self.collection, progress=_IngestProgress(self.progress))
            seconds = time.perf_counter() - started
        doc_of = {n: r.document_id for n, r in zip(numbers, results) if r.status != "failed" and r.document_id}
        indexed = [r for r in results if r.status == "indexed"]
        chunks = sum(r.chunks for r in indexed)
        summary = {
            "files": len(results),
            "indexed": len(indexed),
            "unchanged": sum(r.status == "unchanged" for r in results),
            "failed": sum(r.status == "failed" for r in results),
            "failures": [f"{r.filename}: {r.reason}" for r in results if r.status == "failed"][:20],
            "chunks_indexed": chunks,
            "seconds": round(seconds, 2),
            "chunks_per_s": round(chunks / seconds, 1) if indexed and seconds > 0 else None,
        }
        return summary, doc_of

    def _chunks_of(self, doc_ids: Sequence[str]) -> dict[str, list[str]]:
        """The stored chunk texts of some documents."""
        texts: dict[str, list[str]] = {d: [] for d in doc_ids}
        coll = self.parts.store.collection(self.collection)
        for start in range(0, len(doc_ids), 200):
            part = list(doc_ids[start : start + 200])
            got = coll.get(where={"doc_id": {"$in": part}}, include=["documents", "metadatas"])
            for doc, meta in zip(got["documents"], got["metadatas"]):
                texts[str(meta["doc_id"])].append(doc or "")
        return texts

    # Retrieval.

    async def _retrieve(self, runs: list[_QuestionRun], retriever: Any, vectors: QueryVectors) -> dict[str, Any]:
        import asyncio

        chunks = await asyncio.to_thread(self._chunks_of, sorted({r.doc_id for r in runs}))
        findable = [
            r for r in runs
            if any(bears_answer(t, r.doc_id, r.doc_id, r.question.answers) for t in chunks.get(r.doc_id, []))
        ]
        self.progress.stage("retrieve", len(findable))
        embed_ms: list[float] = []
        search_ms: dict[str, list[float]] = {m: [] for m in self.options.modes}
        modes = self.options.modes
        for i, run in enumerate(findable):
            embed_ms.append(await vectors.prime(run.question.question))
            # Rotate the order: the search right after the embedding request runs while the embedding
            # server's threads still spin on the shared cores, and no method should always pay that.
            for mode in modes[i % len(modes):] + modes[: i % len(modes)]:
                started = time.perf_counter()
                hits = await retriever.search(run.question.question, collection=self.collection, k=DEPTH, mode=mode)
                search_ms[mode].append((time.perf_counter() - started) * 1000)
                run.ranks[mode] = next(
                    (i for i, h in enumerate(hits, 1) if bears_answer(h.text, h.doc_id, run.doc_id, run.question.answers)),
                    None,
                )
            self.progress.advance()
        methods = {}
        for mode in self.options.modes:
            methods[mode] = rank_metrics([r.ranks[mode] for r in findable])
            methods[mode]["search_ms"] = latency_summary(search_ms[mode])
        return {
            "questions": len(findable),
            "without_gold_chunk": len(runs) - len(findable),
            "methods": methods,
            "embed_ms": latency_summary(embed_ms),
            "samples_ms": {"embed": [round(v, 2) for v in embed_ms], **{m: [round(v, 2) for v in search_ms[m]]
                                                                       for m in search_ms}},
        }

    # Answers.

    async def _answer(self, runs: list[_QuestionRun], retriever: Any) -> dict[str, Any]:
        from rag.answering.answerer import Answerer, ChatQuery

        answerer = Answerer(self.parts.llm, retriever, self.settings)
        self.progress.stage("answer", len(runs))
        records = []
        for run in runs:
            query = ChatQuery(
                messages=[{"role": "user", "content": run.question.question}], collection=self.collection,
                top_k=self.settings.top_k, max_tokens=self.options.max_tokens, temperature=0.0,
            )
            started = time.perf_counter()
            try:
                answer = await answerer.start(query)
            except InvalidRequest as exc:  # this question only (too long for the budget, say)
                records.append(_failed_answer(run, exc.message))
            else:
                records.append(await _one_answer(answer, run, started))
            self.progress.advance()
        return {**answer_metrics(records), "prompt_style": answerer.style_choice.name,
                "prompt_style_reason": answerer.style_choice.reason}

    async def _drop_collection(self) -> None:
        """Remove the run's fresh collection: catalog rows first (unsearchable at once), then the chunks."""
        import asyncio

        def drop() -> None:
            catalog = self.parts.catalog
            while records := catalog.list(self.collection, 0, 1000):
                for record in records:
                    catalog.remove(self.collection, record.doc_id)
            self.parts.store.delete_collection(self.collection)
            self.parts.lexical.delete_collection(self.collection)

        await asyncio.to_thread(drop)


async def _one_answer(answer: Any, run: _QuestionRun, started: float) -> dict[str, Any]:
    """Consume one answer's events into what the metrics need."""
    parts: list[str] = []
    texts: dict[str, tuple[str, str]] = {}  # chunk_id -> (doc_id, text)
    record: dict[str, Any] = {"cited": [], "attributed": [], "invalid": 0, "sentences": 0, "unsupported": 0}
    async for event in answer.events():
        if event.name == "token":
            parts.append(event.data["text"])
        elif event.name == "sources":
            texts = {s["chunk_id"]: (s["doc_id"], s["text"]) for s in event.data["sources"]}
        elif event.name == "citations":
            for c in event.data["citations"]:
                record["cited" if c.get("kind", "model") == "model" else "attributed"].append(
                    texts.get(c["chunk_id"], (c["doc_id"], "")))
            record["invalid"] = len(event.data["invalid"])
            sentences = event.data.get("sentences", [])
            record["sentences"] = len(sentences)
            record["unsupported"] = sum(not s["supported"] for s in sentences)
        elif event.name == "done":
            record["ttft_ms"] = event.data.get("ttft_ms")
            record["queue_ms"] = event.data.get("queue_ms")
            record["no_sources"] = event.data.get("finish_reason") == "no_sources"
            record["at_token_limit"] = event.data.get("finish_reason") == "length"
    text = strip_citations("".join(parts))
    golds = run.question.answers
    record.update(
        qid=run.question.qid,
        answer=text,
        em=exact_match(text, golds),
        f1=token_f1(text, golds),
        total_ms=(time.perf_counter() - started) * 1000,
        supported=[bears_answer(t, d, run.doc_id, golds) for d, t in record["cited"]],
        attributed_ok=[bears_answer(t, d, run.doc_id, golds) for d, t in record["attributed"]],
        attributed_said=[bool(text.strip()) and _folded(text) in _folded(t) for _, t in record["attributed"]],
    )
    return record


def _failed_answer(run: _QuestionRun, reason: str) -> dict[str, Any]:
    return {"qid": run.question.qid, "answer": "", "error": reason, "em": 0.0, "f1": 0.0, "cited": [], "invalid": 0,
            "supported": [], "attributed_ok": [], "attributed_said": [], "sentences": 0, "unsupported": 0,
            "total_ms": 0.0}


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def answer_metrics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = max(len(records), 1)
    supported = [s for r in records for s in r["supported"]]
    return {
        "questions": len(records),
        "exact_match": sum(r["em"] for r in records) / n,
        "f1": sum(r["f1"] for r in records) / n,
        "citation_precision": (sum(supported) / len(supported)) if supported else None,
        "citations": len(supported),
        "no_valid_citation": sum(not r["cited"] for r in records) / n,
        "with_invalid_citation": sum(r["invalid"] > 0 for r in records) / n,
        "no_sources_answers": sum(bool(r.get("no_sources")) for r in records),
        "attribution_precision": _share([a for r in records for a in r["attributed_ok"]]),
        "attributed": sum(len(r["attributed_ok"]) for r in records),
        "attributed_holds_answer": _share([a for r in records for a in r["attributed_said"]]),
        "supported_source": sum(any(r["supported"]) or any(r["attributed_ok"]) for r in records) / n,
        "unsupported_sentences": (sum(r["unsupported"] for r in records) / total_sentences
                                  if (total_sentences := sum(r["sentences"] for r in records)) else None),
        "at_token_limit": sum(bool(r.get("at_token_limit")) for r in records) / n,
        "failed": sum("error" in r for r in records),
        "ttft_ms": latency_summary([r["ttft_ms"] for r in records if r.get("ttft_ms") is not None]),
        "total_ms": latency_summary([r["total_ms"] for r in records]),
        "examples": [{k: r[k] for k in ("qid", "answer", "em", "f1")} for r in records[:5]],
        "samples_ms": {"ttft": [r["ttft_ms"] for r in records if r.get("ttft_ms") is not None],
                       "total": [round(r["total_ms"], 1) for r in records]},
    }


def flat_scores(result: dict[str, Any]) -> dict[str, float]:
    """The gated metrics of a result, one flat name each."""
    scores: dict[str, float] = {}
    for mode, m in result["retrieval"]["methods"].items():
        for key in (*(f"recall@{k}" for k in KS), "mrr"):
            scores[f"retrieval.{mode}.{key}"] = round(m[key], 4)
    answers = result.get("answers")
    if answers:
        for key in ("exact_match", "f1", "citation_precision", "no_valid_citation", "attribution_precision",
                    "supported_source"):
            if answers.get(key) is not None:
                scores[f"answers.{key}"] = round(answers[key], 4)
    return scores


# ---------------------------------------------------------------- the report


def write_report(result: dict[str, Any], directory: Path) -> Path:
    """report.md, results.json and the plots (recall@k per method, latency histogram) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")
    plot_recall(result, directory / "recall_at_k.png")
    plot_latency(result, directory / "latency.png")
    path = directory / "report.md"
    path.write_text(report_markdown(result), encoding="utf-8")
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_recall(result: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for mode, m in result["retrieval"]["methods"].items():
        ks = list(range(1, len(m["curve"]) + 1))
        ax.plot(ks, m["curve"], marker="o", label=f"{mode} (MRR {m['mrr']:.3f})")
    ax.set_xlabel("k (chunks retrieved)")
    ax.set_ylabel("recall@k (answer-bearing chunk)")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(range(1, DEPTH + 1))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"{result['dataset']['name']}: {result['retrieval']['questions']} questions")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _log_bins(series: Iterable[Sequence[float]], n: int = 40) -> Any:
    import numpy as np

    values = [v for values in series for v in values if v > 0]
    low, high = (min(values), max(values)) if values else (0.1, 1.0)
    return np.geomspace(low, max(high, low * 1.01), n)


def plot_latency(result: dict[str, Any], path: Path) -> None:
    """Histograms on a log axis: the query embedding and the searches differ by orders of magnitude."""
    plt = _pyplot()
    answers = result.get("answers")
    panels = [("retrieval latency", {("embed query" if k == "embed" else f"{k} search"): v
                                     for k, v in result["retrieval"]["samples_ms"].items() if v})]
    if answers:
        panels.append(("answer latency", {k: answers["samples_ms"][k] for k in ("ttft", "total")
                                          if answers["samples_ms"][k]}))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), dpi=110, squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        bins = _log_bins(series.values())
        for label, values in series.items():
            ax.hist(values, bins=bins, alpha=0.5, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("milliseconds (log scale)")
        ax.set_ylabel("questions")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report_markdown(result: dict[str, Any]) -> str:
    d, c, ing, ret = result["dataset"], result["config"], result["ingest"], result["retrieval"]
    sample = f"a sample of {d['questions']} questions (seed {d['seed']})" if d["limit"] else "all questions"
    lines = [
        f"# Evaluation: {d['name']}",
        "",
        *([f"Provenance: {summary(result['provenance'])}.", ""] if result.get("provenance") else []),
        f"Run {result['started_at']}, {result['elapsed_s']} s. {sample} of {d['total_questions']}; "
        f"{d['contexts']} of {d['total_contexts']} paragraphs indexed into collection `{c['collection']}`.",
        f"Chunks of {c['chunk_tokens']} tokens (overlap {c['chunk_overlap']}), embedder `{c['embed_model']}`, "
        f"hybrid dense weight {c['hybrid_dense_weight']}, retrieval depth {c['retrieval_depth']}, "
        f"reranker {'on' if c['reranker'] else 'off'}.",
        "",
        f"Ingest: {ing['indexed']} indexed, {ing['unchanged']} unchanged, {ing['failed']} failed; "
        f"{ing['chunks_indexed']} chunks in {ing['seconds']} s ({ing['chunks_per_s'] or 'n/a'} chunks/s).",
        "",
        "## Retrieval",
        "",
        f"{ret['questions']} questions; {ret['without_gold_chunk']} more have no answer-bearing chunk "
        "(the answer was cut across chunks) and are left out.",
        "",
        "| method | recall@1 | recall@5 | recall@10 | MRR | search p50 ms | p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, m in ret["methods"].items():
        lat = m["search_ms"]
        lines.append(f"| {mode} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['recall@10']:.3f} | "
                     f"{m['mrr']:.3f} | {lat.get('p50', 'n/a')} | {lat.get('p95', 'n/a')} |")
    emb = ret["embed_ms"]
    lines += ["", f"Query embedding: p50 {emb.get('p50')} ms, p95 {emb.get('p95')} ms (once per question, "
              "shared by the methods).", "", "![recall@k](recall_at_k.png)", "", "![latency](latency.png)", ""]
    answers = result.get("answers")
    if answers:
        ttft, total = answers["ttft_ms"], answers["total_ms"]
        lines += [
            "## Answers", "",
            f"{answers['questions']} questions, top_k {c['top_k']}, max_tokens {c['max_tokens'] or 'the style default'}, "
            f"model `{c['llm_model']}`, prompt style `{answers.get('prompt_style')}` ({answers.get('prompt_style_reason')}).",
            "",
            "| exact match | F1 | citation precision | no valid citation | with an invalid citation |",
            "|---|---|---|---|---|",
            f"| {answers['exact_match']:.3f} | {answers['f1']:.3f} | {_pct(answers['citation_precision'])} "
            f"({answers['citations']} citations) | {answers['no_valid_citation']:.3f} | "
            f"{answers['with_invalid_citation']:.3f} |",
            "",
            "| attribution precision | attributed chunk holds the answer said | with a supported source | "
            "unsupported sentences | at the token limit |",
            "|---|---|---|---|---|",
            f"| {_pct(answers.get('attribution_precision'))} ({answers.get('attributed')} attributed) | "
            f"{_pct(answers.get('attributed_holds_answer'))} | {_pct(answers.get('supported_source'))} | "
            f"{_pct(answers.get('unsupported_sentences'))} | {_pct(answers.get('at_token_limit'))} |",
            "",
            f"TTFT p50 {ttft.get('p50')} ms, p95 {ttft.get('p95')} ms; whole answer p50 {total.get('p50')} ms, "
            f"p95 {total.get('p95')} ms.",
            "",
        ]
    lines += ["## Gated scores", "", "```json", json.dumps(result["scores"], indent=2), "```", ""]
    return "\n".join(lines)
