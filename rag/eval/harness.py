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
answers cut by max_tokens; `empty_first_attempt` the share whose first generation held no letter or digit
(the answer before its retry: rag.answering.no_answer), `no_answer` the share still empty after it (their
text is the fixed "the model gave no answer" line).

`scores` is the flat dict of gated metrics; all are better higher except those in LOWER_IS_BETTER.
`provenance` (the commit or version, the date, the machine and its load average as the run started) and
`config` (the settings that shape the numbers) say what produced them; the gate compares `scores` only.

This module holds the run; the question set (`_squad`), the metrics (`_metrics`), the regression gate
(`_gate`) and the report (`_report`) have modules of their own, their public names re-exported here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rag.answering.events import AnswerDocument, Done
from rag.answering.retrieval import MODES
from rag.core.config import Settings
from rag.core.embeddings_api import InputType
from rag.core.errors import InvalidRequest, RagError
from rag.core.provenance import provenance
from rag.eval._gate import LOWER_IS_BETTER, Regression, compare, flat_scores, read_baseline, sample_differs, unmeasured
from rag.eval._metrics import (
    DEPTH,
    KS,
    answer_metrics,
    answer_tokens,
    bears_answer,
    exact_match,
    folded,
    latency_summary,
    normalize_answer,
    rank_metrics,
    strip_citations,
    token_f1,
)
from rag.eval._report import plot_latency, plot_recall, report_markdown, write_report
from rag.eval._squad import EvalQuestion, EvalSet, read_squad

if TYPE_CHECKING:
    from rag.answering.answerer import Answer, NoSourcesAnswer

__all__ = [
    "DEPTH",
    "KS",
    "LOWER_IS_BETTER",
    "MODES",
    "EvalOptions",
    "EvalProgress",
    "EvalQuestion",
    "EvalSet",
    "Evaluation",
    "NoEvalProgress",
    "Parts",
    "QueryVectors",
    "Regression",
    "answer_metrics",
    "answer_tokens",
    "bears_answer",
    "compare",
    "exact_match",
    "flat_scores",
    "fresh_collection_name",
    "latency_summary",
    "normalize_answer",
    "plot_latency",
    "plot_recall",
    "rank_metrics",
    "read_baseline",
    "read_squad",
    "report_markdown",
    "sample_differs",
    "strip_citations",
    "token_f1",
    "unmeasured",
    "write_report",
]


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
    answer_limit: int | None = None  # answers for the first N sampled questions only (None: all)
    seed: int = 0


class QueryVectors:
    """The embedder for the retriever: each question is embedded once (timed) and reused by every method.

    Memoized per input kind: the retriever's check of a collection's embedder embeds its probe text as a
    passage, which a model with prompts per kind (multilingual-e5-small) embeds otherwise than a question.
    """

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self._memo: dict[tuple[str, InputType], Sequence[float]] = {}

    async def prime(self, text: str) -> float:
        """Embed `text` now; the milliseconds it took."""
        self._memo.clear()
        started = time.perf_counter()
        self._memo[text, "query"] = (await self.embedder.embed([text], kind="query"))[0]
        return (time.perf_counter() - started) * 1000

    async def embed(self, texts: list[str], kind: InputType = "query") -> list[Sequence[float]]:
        if len(self._memo) > 64:  # answering asks one question after another: stay small
            self._memo.clear()
        missing = [t for t in texts if (t, kind) not in self._memo]
        if missing:
            self._memo.update(((t, kind), v) for t, v in zip(missing, await self.embedder.embed(missing, kind=kind)))
        return [self._memo[t, kind] for t in texts]


class _IngestProgress:
    """The pipeline's progress protocol, fed into the run's progress bar."""

    def __init__(self, progress: EvalProgress) -> None:
        self.progress = progress

    def file_started(self, file: Any) -> None:
        pass

    def page_read(self, file: Any, n: int, total: int | None) -> None:
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

    def __init__(
        self, parts: Parts, settings: Settings, options: EvalOptions, progress: EvalProgress | None = None
    ) -> None:
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
            _refuse_all_failed(ingest)
            runs = [_QuestionRun(q, doc_of[q.context]) for q in evalset.questions if q.context in doc_of]
            retrieval = await self._retrieve(runs, retriever, vectors)
            answers = await self._answer(runs[: self.options.answer_limit], retriever) if self.options.answers else None
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
            "name": evalset.name,
            "sha256": evalset.sha256,
            "limit": self.options.limit,
            "seed": self.options.seed,
            "questions": len(evalset.questions),
            "contexts": len(evalset.contexts),
            "total_questions": evalset.total_questions,
            "total_contexts": evalset.total_contexts,
        }

    def _config(self, fresh: bool) -> dict[str, Any]:
        s = self.settings
        return {
            "collection": self.collection,
            "fresh_collection": fresh,
            "kept": (not fresh) or self.options.keep,
            "chunk_tokens": s.chunk_tokens,
            "chunk_overlap": s.chunk_overlap,
            "top_k": s.top_k,
            "hybrid_dense_weight": s.hybrid_dense_weight,
            "hybrid_dense_weight_cjk": s.hybrid_dense_weight_cjk,
            "retrieval_depth": s.retrieval_depth,
            "reranker": bool(s.reranker_url),
            "min_score": s.min_score,
            "embed_model": s.embed_model,
            "embed_url": s.embed_url,
            "llm_model": s.llm_model,
            "llm_url": s.llm_url if self.options.answers else None,
            "max_tokens": self.options.max_tokens,
            "answer_limit": self.options.answer_limit,
            "generator": s.generator,
            "chroma_mode": s.chroma_mode,
            "modes": list(self.options.modes),
            "llm_prompt_style": s.llm_prompt_style,
            "completion_max_tokens": s.completion_max_tokens,
            "completion_max_sources": s.completion_max_sources,
            "embed_model_path": s.embed_model_path,
            "rerank_depth": s.rerank_depth,
            "refusal_rule": s.refusal_rule,
            "min_relevance": s.min_relevance,
            "min_relevance_cjk": s.min_relevance_cjk,
            "context_budget": s.context_budget,
            "answer_reserve": s.answer_reserve,
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
            r
            for r in runs
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
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
                started = time.perf_counter()
                hits = await retriever.search(run.question.question, collection=self.collection, k=DEPTH, mode=mode)
                search_ms[mode].append((time.perf_counter() - started) * 1000)
                run.ranks[mode] = next(
                    (
                        i
                        for i, h in enumerate(hits, 1)
                        if bears_answer(h.text, h.doc_id, run.doc_id, run.question.answers)
                    ),
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
            "samples_ms": {
                "embed": [round(v, 2) for v in embed_ms],
                **{m: [round(v, 2) for v in search_ms[m]] for m in search_ms},
            },
        }

    # Answers.

    async def _answer(self, runs: list[_QuestionRun], retriever: Any) -> dict[str, Any]:
        from rag.answering.answerer import Answerer, ChatQuery

        answerer = Answerer(self.parts.llm, retriever, self.settings)
        self.progress.stage("answer", len(runs))
        records = []
        for run in runs:
            query = ChatQuery(
                messages=[{"role": "user", "content": run.question.question}],
                collection=self.collection,
                top_k=self.settings.top_k,
                max_tokens=self.options.max_tokens,
                temperature=0.0,
            )
            started = time.perf_counter()
            try:
                answer = await answerer.start(query)
            except InvalidRequest as exc:  # this question only (too long for the budget, say)
                records.append(_failed_answer(run, exc.message))
            else:
                records.append(await _one_answer(answer, run, started))
            self.progress.advance()
        return {
            **answer_metrics(records),
            "prompt_style": answerer.style_choice.name,
            "prompt_style_reason": answerer.style_choice.reason,
        }

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


FAILURES_SHOWN = 3  # of a run whose every file failed, the first reasons in its error


def _refuse_all_failed(ingest: dict[str, Any]) -> None:
    """A run with nothing indexed measures nothing: it stops with why its files failed."""
    if ingest["files"] and ingest["failed"] == ingest["files"]:
        reasons = "; ".join(ingest["failures"][:FAILURES_SHOWN])
        raise RagError(f"none of the {ingest['files']} files of the set was indexed; the first failures: {reasons}")


async def _one_answer(answer: Answer | NoSourcesAnswer, run: _QuestionRun, started: float) -> dict[str, Any]:
    """Consume one answer's events into what the metrics need."""
    document = await AnswerDocument.collect(answer.events())
    texts = {s.chunk_id: (s.doc_id, s.text) for s in document.sources}  # chunk_id -> (doc_id, text)
    citations, done = document.citations, document.done
    record: dict[str, Any] = {"cited": [], "attributed": []}
    for c in citations.citations:
        record["cited" if c.kind == "model" else "attributed"].append(texts.get(c.chunk_id, (c.doc_id, "")))
    record.update(
        invalid=len(citations.invalid),
        sentences=len(citations.sentences),
        unsupported=sum(not s.supported for s in citations.sentences),
        ttft_ms=done.ttft_ms,
        queue_ms=done.queue_ms if isinstance(done, Done) else None,
        no_sources=done.finish_reason == "no_sources",
        at_token_limit=done.finish_reason == "length",
        no_answer=isinstance(done, Done) and done.no_answer,
        retried=isinstance(done, Done) and done.retried,
        retry_reason=done.retry_reason if isinstance(done, Done) else None,
        likelihood=done.likelihood if isinstance(done, Done) else None,
        unsure=isinstance(done, Done) and done.unsure,
    )
    text = strip_citations(document.answer)
    golds = run.question.answers
    record.update(
        qid=run.question.qid,
        answer=text,
        em=exact_match(text, golds),
        f1=token_f1(text, golds),
        total_ms=(time.perf_counter() - started) * 1000,
        supported=[bears_answer(t, d, run.doc_id, golds) for d, t in record["cited"]],
        attributed_ok=[bears_answer(t, d, run.doc_id, golds) for d, t in record["attributed"]],
        attributed_said=[bool(text.strip()) and folded(text) in folded(t) for _, t in record["attributed"]],
    )
    return record


def _failed_answer(run: _QuestionRun, reason: str) -> dict[str, Any]:
    return {
        "qid": run.question.qid,
        "answer": "",
        "error": reason,
        "em": 0.0,
        "f1": 0.0,
        "cited": [],
        "invalid": 0,
        "supported": [],
        "attributed_ok": [],
        "attributed_said": [],
        "sentences": 0,
        "unsupported": 0,
        "total_ms": 0.0,
    }
