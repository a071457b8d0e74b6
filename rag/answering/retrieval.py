"""Retrieval: dense search in Chroma fused with BM25, filtered by the catalog, optionally reranked.

Fusion is a convex combination of min-max normalized scores over the union of both candidate lists:
    fused = w(q) * dense + (1 - w(q)) * lexical
where a chunk missing from one list scores 0 there (it ranked below that list's last candidate). Unlike
reciprocal rank fusion it keeps the margins: a BM25 hit far ahead of the rest is not pulled down by a
noisy dense rank. The dense weight adapts to the query's script:
    w(q) = hybrid_dense_weight * (1 - c) + hybrid_dense_weight_cjk * c
with c the share of CJK characters among the query's letters and digits, because the bundled
English-only MiniLM turns Chinese into [UNK]s (a multilingual embedder such as bge-m3 deserves a CJK weight
of its own). With a weight of 0 (or 1) the fused order is exactly BM25's (or the dense one).

The defaults come from `bench/retrieval_quality.py` (~200-token chunks, tuned on half the questions,
numbers on the other half): on SQuAD dev w = 0.4 gives R@1 0.832 / R@5 0.962 against BM25's 0.813 / 0.942
and MiniLM's 0.665 / 0.885 (equal-weight RRF: 0.769 / 0.944); any w in 0.25-0.5 beats both. On CMRC the
dense list is noise (R@5 0.18) and every w > 0.05 loses to BM25 alone, hence a CJK weight of 0.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Protocol

from rag.answering.named_terms import names
from rag.clients.rerank import RerankClient
from rag.core.config import Settings
from rag.core.embeddings_api import InputType
from rag.core.errors import BackendUnavailable, InvalidRequest, UpstreamError
from rag.store.chunk_record import LexicalIndex, cjk_fraction
from rag.store.record import Vectors, check_embedder_of
from rag.store.vectors import VectorStore

log = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("dense", "lexical", "hybrid")  # in the order `rag eval` measures and reports them


class Embedder(Protocol):
    # One row per text; `kind` is "query" for questions, "passage" for documents (E5 embeds each its way).
    async def embed(self, texts: list[str], kind: InputType = "passage") -> Vectors | Sequence[Sequence[float]]: ...


class Catalog(Protocol):
    # The searchable documents among doc_ids, with the name each is cited by now ("": the chunk's own).
    def indexed_names(self, collection: str, doc_ids: Iterable[str]) -> dict[str, str]: ...


class Reranker(Protocol):
    async def rerank(self, query: str, documents: list[str]) -> list[float]: ...


@dataclass
class RetrievedChunk:
    chunk_id: str
    doc_id: str
    text: str
    metadata: dict[str, Any]
    score: float
    dense_rank: int | None  # 1-based rank in the dense candidates, None when not among them
    lexical_rank: int | None
    cosine: float | None = None  # raw cosine similarity to the query (None when not a dense candidate)
    coverage: float = 0.0  # share of the query's search terms that the chunk contains, weighted by their IDF
    absent: float = 0.0  # share of the query's search terms that no chunk of the index holds (IDF-weighted; per query)
    unknown_names: tuple[str, ...] = ()  # the query's names no searched chunk holds (rag.answering.named_terms)


@dataclass
class _Candidate:
    chunk_id: str
    doc_id: str
    dense_score: float | None = None
    lexical_score: float | None = None
    dense_rank: int | None = None
    lexical_rank: int | None = None
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    score: float = 0.0
    name: str = ""  # the document's name now, from the catalog: the chunk's stored one may be a twin's

    def result(
        self, weights: dict[str, float], tokenize: Any, absent: float = 0.0, unknown_names: tuple[str, ...] = ()
    ) -> RetrievedChunk:
        text = self.text or ""
        total = sum(weights.values())
        coverage = sum(weights[t] for t in set(tokenize(text)) & weights.keys()) / total if total > 0 else 0.0
        return RetrievedChunk(
            self.chunk_id,
            self.doc_id,
            text,
            # A chunk keeps the name it was first indexed under; the same bytes later known only by
            # another name (the first one now names a newer version) are cited by that name.
            self.metadata | {"source": self.name} if self.name else self.metadata,
            self.score,
            self.dense_rank,
            self.lexical_rank,
            self.dense_score,
            round(coverage, 4),
            absent,
            unknown_names,
        )


_NO_TERM = "\x00"  # a term no tokenizer makes: its IDF is the weight of a term that no chunk holds


def absent_share(weights: dict[str, float], unseen: float) -> float:
    """The IDF-weighted share of the terms that no chunk of the index holds (those weighing `unseen`)."""
    total = sum(weights.values())
    if total <= 0:
        return 0.0
    return round(sum(w for w in weights.values() if w >= unseen - 1e-9) / total, 4)


def dense_weight_for(query: str, settings: Settings) -> float:
    """The query's dense weight: the CJK weight in proportion to the query's CJK characters."""
    c = cjk_fraction(query)
    return settings.hybrid_dense_weight * (1 - c) + settings.hybrid_dense_weight_cjk * c


class Matched(Protocol):
    """What the relevance floor reads of a retrieved chunk (RetrievedChunk is one)."""

    @property
    def cosine(self) -> float | None: ...
    @property
    def coverage(self) -> float: ...


def relevance(query: str, hits: Sequence[Matched], settings: Settings, *, blend: float | None = None) -> float:
    """How well the best retrieved chunk matches the query, on one scale for every query (0-1).

    A chunk scores a * cosine + (1 - a) * coverage, with a the query's dense weight (times `blend`):
    the raw cosine is the embedder's own scale and the coverage (the IDF-weighted share of the query's
    search terms the chunk holds: a rare name counts more than "year") is the lexical one, so a CJK query that MiniLM cannot read is judged by its terms.
    The fused score cannot serve: it is normalised per query, so every query's best chunk scores 1.
    """
    scale = settings.relevance_dense_scale if blend is None else blend  # per embedder (config's CALIBRATED)
    a = min(1.0, dense_weight_for(query, settings) * scale)
    return max((a * max(h.cosine or 0.0, 0.0) + (1 - a) * h.coverage for h in hits), default=0.0)


def relevance_floor(query: str, settings: Settings) -> float:
    """The query's "not in the documents" floor: the CJK one in proportion to its CJK characters."""
    c = cjk_fraction(query)
    return settings.min_relevance * (1 - c) + settings.min_relevance_cjk * c


def min_max(scores: Sequence[float]) -> list[float]:
    """Scores mapped onto [0, 1]; a list of equal scores maps to 1."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high == low:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]


def fuse(
    dense: Sequence[tuple[str, float]], lexical: Sequence[tuple[str, float]], dense_weight: float
) -> list[tuple[str, float]]:
    """(id, fused score) best first, from two (id, score) lists each sorted best first.

    Ties go to the list with the larger weight, so a weight of 0 or 1 gives back that list's order.
    """
    fused: dict[str, float] = {}
    for hits, weight in ((dense, dense_weight), (lexical, 1.0 - dense_weight)):
        for (chunk_id, _), norm in zip(hits, min_max([s for _, s in hits])):
            fused[chunk_id] = fused.get(chunk_id, 0.0) + weight * norm
    primary = dense if dense_weight > 0.5 else lexical
    secondary = lexical if primary is dense else dense
    rank_in = [{cid: r for r, (cid, _) in enumerate(hits)} for hits in (primary, secondary)]
    missing = len(dense) + len(lexical)

    def key(item: tuple[str, float]) -> tuple[float, int, int]:
        return (-item[1], rank_in[0].get(item[0], missing), rank_in[1].get(item[0], missing))

    return sorted(fused.items(), key=key)


class Retriever:
    """Finds the chunks of indexed documents that answer a query."""

    def __init__(
        self,
        embedder: Embedder,
        store: VectorStore,
        lexical: LexicalIndex,
        catalog: Catalog,
        settings: Settings,
        *,
        reranker: Reranker | None = None,
    ) -> None:
        self.embedder = embedder
        self.store = store
        self.lexical = lexical
        self.catalog = catalog
        self.settings = settings
        self._verified: set[str] = set()  # collections whose recorded embedder the query embedder matches
        self._widths: dict[str, int] = {}  # their vectors' dimensions: a query's vector must have as many
        # The check's own embedder: the metrics time `self.embedder` as a query's embed stage, which it is not.
        self._probe_embedder = embedder
        self._own_reranker = None if reranker is not None else RerankClient.from_settings(settings)
        self.reranker: Reranker | None = reranker or self._own_reranker

    async def aclose(self) -> None:
        if self._own_reranker:
            await self._own_reranker.aclose()

    async def search(
        self, query: str, *, collection: str, k: int, doc_ids: Iterable[str] | None = None, mode: str = "hybrid"
    ) -> list[RetrievedChunk]:
        """The k best chunks, best first. `doc_ids` (None or empty: all) limits the documents searched."""
        if mode not in MODES:
            raise InvalidRequest(f"unknown retrieval mode {mode!r}", modes=list(MODES))
        if k <= 0 or not query.strip():
            return []
        only = sorted(set(doc_ids)) if doc_ids else None
        depth = max(k, self.settings.retrieval_depth, self.settings.rerank_depth if self.reranker else 0)
        for _ in range(3):
            candidates, full = await self._candidates(query, collection, depth, only, mode)
            ranked = await self._indexed_only(collection, candidates)
            # Hits of documents that are not (or no longer) indexed were dropped: look deeper if that left too few.
            if len(ranked) >= k or not full or len(ranked) == len(candidates):
                break
            depth *= 4
        if self.reranker and mode == "hybrid":
            ranked = await self._rerank(query, collection, ranked[: max(k, self.settings.rerank_depth)])
        top = ranked[:k]
        await self._attach_texts(collection, top)
        tokenize = self.lexical.tokenizer
        if not top:
            return []
        weights = await asyncio.to_thread(self.lexical.idf, [*tokenize(query), _NO_TERM])
        absent = absent_share(weights, weights.pop(_NO_TERM, 0.0))
        unknown = await self._unknown_names(query, collection, only)
        return [c.result(weights, tokenize, absent, unknown) for c in top if c.text is not None]

    async def _unknown_names(self, query: str, collection: str, only: list[str] | None) -> tuple[str, ...]:
        """The query's names (rag.answering.named_terms) no chunk of the searched documents holds a term of."""
        if not self.settings.refuse_unknown_names:
            return ()
        named = {name: self.lexical.tokenizer(name) for name in names(query)}
        if not any(named.values()):
            return ()
        held = await asyncio.to_thread(self.lexical.held, collection, list(chain(*named.values())), only)
        return tuple(name for name, terms in named.items() if terms and held.isdisjoint(terms))

    async def _candidates(
        self, query: str, collection: str, depth: int, only: list[str] | None, mode: str
    ) -> tuple[list[_Candidate], bool]:
        """Fused candidates, and whether some list came back full (more may lie deeper)."""
        lexical_job = (
            asyncio.to_thread(self.lexical.search, collection, query, depth, only) if mode != "dense" else None
        )
        dense_job = self._dense(query, collection, depth, only) if mode != "lexical" else None
        lexical_hits, dense_hits = await asyncio.gather(_or_empty(lexical_job), _or_empty(dense_job))
        by_id: dict[str, _Candidate] = {}
        for rank, hit in enumerate(dense_hits, 1):
            doc_id = str(hit.metadata.get("doc_id") or hit.id.rsplit(":", 1)[0])  # a chunk id is "doc_id:index"
            by_id[hit.id] = _Candidate(
                hit.id, doc_id, dense_score=hit.score, dense_rank=rank, text=hit.text, metadata=hit.metadata
            )
        for rank, hit in enumerate(lexical_hits, 1):
            cand = by_id.setdefault(hit.chunk_id, _Candidate(hit.chunk_id, hit.doc_id))
            cand.lexical_score, cand.lexical_rank = hit.score, rank
        weight = 1.0 if mode == "dense" else 0.0 if mode == "lexical" else dense_weight_for(query, self.settings)
        fused = fuse([(h.id, h.score) for h in dense_hits], [(h.chunk_id, h.score) for h in lexical_hits], weight)
        ranked = []
        for chunk_id, score in fused:
            cand = by_id[chunk_id]
            cand.score = {"dense": cand.dense_score, "lexical": cand.lexical_score}.get(mode, score) or 0.0
            ranked.append(cand)
        return ranked, depth in (len(dense_hits), len(lexical_hits))

    async def _check_embedder(self, collection: str) -> None:
        """A collection embedded by another model than the one serving queries is a 409 (reindex it), not a
        search that quietly finds nothing: its probe text embedded again must give its recorded vector."""
        if collection in self._verified:
            return

        async def embed(text: str) -> Sequence[float]:
            return (await self._probe_embedder.embed([text], kind="passage"))[0]

        recorded = await asyncio.to_thread(self.lexical.embedder, collection)
        await check_embedder_of(collection, recorded, self.settings.embed_model, embed)
        self._verified.add(collection)
        if recorded is not None:
            self._widths[collection] = recorded.dimensions

    async def _dense(self, query: str, collection: str, depth: int, only: list[str] | None) -> list[Any]:
        await self._check_embedder(collection)
        vector = (await self.embedder.embed([query], kind="query"))[0]
        width = self._widths.get(collection)
        if width is not None and len(vector) != width:
            raise UpstreamError(
                f"embedding server returned a {len(vector)}-dimensional vector for the query; collection "
                f"{collection!r} holds {width}-dimensional ones",
                dimensions=len(vector),
                expected=width,
            )
        # Ids and distances only: texts and metadata are read for the final top k (_attach_texts).
        return await asyncio.to_thread(
            functools.partial(self.store.query, texts=False), collection, vector, depth, only
        )

    async def _indexed_only(self, collection: str, candidates: list[_Candidate]) -> list[_Candidate]:
        if not candidates:
            return []
        indexed = await asyncio.to_thread(self.catalog.indexed_names, collection, {c.doc_id for c in candidates})
        kept = [c for c in candidates if c.doc_id in indexed]
        for cand in kept:
            cand.name = indexed[cand.doc_id]
        return kept

    async def _attach_texts(self, collection: str, candidates: list[_Candidate]) -> None:
        """Text and metadata from Chroma for the candidates that have none yet (dense hits come without)."""
        missing = [c for c in candidates if c.text is None]
        if not missing:
            return
        stored = await asyncio.to_thread(self.store.get, collection, [c.chunk_id for c in missing])
        by_id = {s.id: s for s in stored}
        for cand in missing:
            if cand.chunk_id in by_id:
                cand.text, cand.metadata = by_id[cand.chunk_id].text, by_id[cand.chunk_id].metadata

    async def _rerank(self, query: str, collection: str, head: list[_Candidate]) -> list[_Candidate]:
        """The head reordered by the reranker's scores; the fused order when the reranker fails."""
        assert self.reranker is not None
        await self._attach_texts(collection, head)
        head = [c for c in head if c.text is not None]
        try:
            scores = await self.reranker.rerank(query, [c.text or "" for c in head])
        except (BackendUnavailable, UpstreamError) as exc:
            log.warning("reranking skipped, keeping the fused order: %s", exc.message)
            return head
        for cand, score in zip(head, scores):
            cand.score = score
        return sorted(head, key=lambda c: -c.score)


async def _or_empty(job: Any) -> list[Any]:
    return await job if job is not None else []
