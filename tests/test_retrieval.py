"""Retrieval: the fusion, the adaptive dense weight, filters, the catalog, reranking; real Chroma on disk.

Unit tests embed with a deterministic bag-of-words embedder; the integration tests at the end use the real
embedding server (bundled all-MiniLM-L6-v2) on SQuAD and CMRC paragraphs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag.answering.retrieval import Retriever, dense_weight_for, fuse, min_max
from rag.clients.embedding import EmbeddingClient
from rag.clients.rerank import RerankClient
from rag.core.config import Settings
from rag.core.errors import BackendUnavailable, InvalidRequest, NotFound, UpstreamError
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex, lexical_tokens
from tests.data import CMRC, SQUAD

DIM = 64

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ------------------------------------------------------------------ fusion


def ranked_ids(fused: list[tuple[str, float]]) -> list[str]:
    return [cid for cid, _ in fused]


def test_min_max() -> None:
    assert min_max([]) == []
    assert min_max([3.0, 3.0]) == [1.0, 1.0]
    assert min_max([4.0, 2.0, 0.0]) == [1.0, 0.5, 0.0]


def test_weight_zero_or_one_gives_back_that_list() -> None:
    dense = [("d1", 0.9), ("x", 0.8), ("d2", 0.1)]
    lexical = [("l1", 12.0), ("l2", 5.0), ("x", 1.0)]
    assert ranked_ids(fuse(dense, lexical, 0.0)) == ["l1", "l2", "x", "d1", "d2"]
    assert ranked_ids(fuse(dense, lexical, 1.0)) == ["d1", "x", "d2", "l1", "l2"]


def test_a_confident_bm25_hit_survives_a_noisy_dense_list() -> None:
    # BM25 is sure (a wide margin); the dense scores are flat noise that happens to rank it low. Equal
    # reciprocal rank fusion ranks "noise1" first; the score fusion keeps the BM25 winner.
    lexical = [("answer", 30.0), ("other", 8.0), ("noise1", 7.5)]
    dense = [("noise1", 0.41), ("noise2", 0.40), ("other", 0.40), ("answer", 0.39)]
    assert ranked_ids(fuse(dense, lexical, 0.3))[0] == "answer"


def test_agreement_lifts_a_chunk_above_both_single_winners() -> None:
    dense = [("d", 0.80), ("both", 0.78), ("z", 0.2)]
    lexical = [("l", 10.0), ("both", 9.5), ("y", 1.0)]
    assert ranked_ids(fuse(dense, lexical, 0.5))[0] == "both"


def test_missing_from_one_list_counts_as_its_floor() -> None:
    fused = dict(fuse([("a", 0.9), ("b", 0.5)], [("b", 3.0), ("c", 1.0)], 0.5))
    assert fused == {"a": 0.5, "b": 0.5, "c": 0.0}


scores = st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=12)


@st.composite
def two_lists(draw):
    ids = [f"c{i}" for i in range(16)]
    dense_ids = draw(st.lists(st.sampled_from(ids), unique=True, max_size=10))
    lexical_ids = draw(st.lists(st.sampled_from(ids), unique=True, max_size=10))
    dense = sorted(
        zip(dense_ids, draw(st.lists(st.floats(-1, 1), min_size=len(dense_ids), max_size=len(dense_ids)))),
        key=lambda h: -h[1],
    )
    lexical = sorted(
        zip(lexical_ids, draw(st.lists(st.floats(0, 50), min_size=len(lexical_ids), max_size=len(lexical_ids)))),
        key=lambda h: -h[1],
    )
    return dense, lexical, draw(st.floats(0, 1))


@given(two_lists())
def test_fusion_properties(case) -> None:
    dense, lexical, weight = case
    fused = fuse(dense, lexical, weight)
    got = ranked_ids(fused)
    assert sorted(got) == sorted({c for c, _ in dense} | {c for c, _ in lexical})  # the union, once each
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
    assert all(-1e-9 <= s <= 1 + 1e-9 for _, s in fused)
    # Among the chunks that only one list holds, that list's order is kept.
    for hits in (dense, lexical):
        others = {c for c, _ in (lexical if hits is dense else dense)}
        only_here = [c for c, _ in hits if c not in others]
        assert [c for c in got if c in only_here] == only_here
    # A chunk first in both lists, by a strict margin, is first after fusion.
    if dense and lexical and dense[0][0] == lexical[0][0]:
        strict = all(len(h) < 2 or h[0][1] > h[1][1] for h in (dense, lexical))
        if strict:
            assert got[0] == dense[0][0]


@given(two_lists())
def test_weight_zero_is_exactly_bm25(case) -> None:
    dense, lexical, _ = case
    got = ranked_ids(fuse(dense, lexical, 0.0))
    assert got[: len(lexical)] == [c for c, _ in lexical]


@pytest.mark.parametrize(
    ("query", "expected"),
    [("Who founded the university?", 0.3), ("北京大学是哪一年创建的？", 0.0), ("Python的装饰器", 0.3 * 6 / 10)],
)
def test_dense_weight_follows_the_query_script(query: str, expected: float) -> None:
    settings = Settings(hybrid_dense_weight=0.3, hybrid_dense_weight_cjk=0.0)
    assert math.isclose(dense_weight_for(query, settings), expected)


# ------------------------------------------------------------------ a real store, a toy embedder


class BagOfWordsEmbedder:
    """Deterministic unit vectors from hashed tokens: texts sharing words are close."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        self.calls.append(texts)
        return [self.vector(t) for t in texts]

    @staticmethod
    def vector(text: str) -> list[float]:
        v = [0.0] * DIM
        for token in lexical_tokens(text) or ["<empty>"]:
            v[int(hashlib.md5(token.encode()).hexdigest(), 16) % DIM] += 1.0
        norm = math.sqrt(sum(x * x for x in v))
        return [x / norm for x in v]


class DictCatalog:
    """Document states per collection, like the document catalog keeps them."""

    def __init__(self, states: dict[tuple[str, str], str] | None = None) -> None:
        self.states = states or {}
        self.asked: list[set[str]] = []

    def indexed_names(self, collection: str, doc_ids: Iterable[str]) -> dict[str, str]:
        doc_ids = set(doc_ids)
        self.asked.append(doc_ids)
        return {d: "" for d in doc_ids if self.states.get((collection, d)) == "indexed"}


class ScriptedReranker:
    """Scores a document by how often it contains the query's last word; or fails."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.seen: list[list[str]] = []

    async def rerank(self, query: str, documents: list[str]) -> list[float]:
        self.seen.append(documents)
        if self.fail:
            raise self.fail
        word = query.split()[-1].lower()
        return [float(d.lower().count(word)) for d in documents]


DOCS = {
    "chicago": [
        "The University of Chicago was founded in 1890 by John D. Rockefeller.",
        "Its main campus lies in the Hyde Park neighborhood of Chicago.",
    ],
    "bowl": ["Super Bowl 50 was an American football game played at Levi's Stadium in Santa Clara."],
    "beida": ["北京大学创建于1898年，初名京师大学堂，是中国近代第一所国立综合性大学。"],
    "volcano": ["A volcano is a rupture in the crust of a planet through which lava escapes."],
}


async def index_docs(
    store: ChunkStore,
    lexical: LexicalIndex,
    collection: str,
    docs: dict[str, list[str]],
    catalog: DictCatalog | None = None,
    embed=BagOfWordsEmbedder.vector,
) -> None:
    ids, vectors, texts, metas = [], [], [], []
    for doc_id, chunks in docs.items():
        for i, text in enumerate(chunks):
            ids.append(f"{doc_id}:{i}")
            vectors.append(embed(text))
            texts.append(text)
            metas.append({"doc_id": doc_id, "chunk_index": i, "source": f"{doc_id}.txt"})
            if catalog is not None:
                catalog.states[(collection, doc_id)] = "indexed"
    store.upsert(collection, ids, vectors, texts, metas)
    lexical.add(collection, [(i, m["doc_id"], t) for i, m, t in zip(ids, metas, texts)])


@pytest.fixture
def parts(tmp_path: Path):
    settings = Settings(data_dir=tmp_path, retrieval_depth=10)
    store = ChunkStore.open(settings)
    lexical = LexicalIndex(tmp_path / "lexical.sqlite")
    yield settings, store, lexical
    lexical.close()


@pytest.fixture
async def retriever(parts):
    settings, store, lexical = parts
    catalog = DictCatalog()
    await index_docs(store, lexical, "docs", DOCS, catalog)
    await index_docs(store, lexical, "elsewhere", {"stray": ["The University of Chicago, copied elsewhere."]}, catalog)
    r = Retriever(BagOfWordsEmbedder(), store, lexical, catalog, settings)
    yield r
    await r.aclose()


def chunk_ids(found) -> list[str]:
    return [c.chunk_id for c in found]


@pytest.mark.parametrize("mode", ["hybrid", "dense", "lexical"])
async def test_finds_the_right_chunk_in_each_mode(retriever: Retriever, mode: str) -> None:
    found = await retriever.search("When was the University of Chicago founded?", collection="docs", k=3, mode=mode)
    assert found[0].chunk_id == "chicago:0"
    assert found[0].doc_id == "chicago" and found[0].metadata["source"] == "chicago.txt"
    assert found[0].text.startswith("The University of Chicago")
    assert len(found) <= 3 and [c.score for c in found] == sorted((c.score for c in found), reverse=True)
    assert (found[0].dense_rank is None) == (mode == "lexical")
    assert (found[0].lexical_rank is None) == (mode == "dense")


async def test_chinese_query_is_answered_by_bm25(retriever: Retriever) -> None:
    found = await retriever.search("北京大学是哪一年创建的？", collection="docs", k=2)
    assert found[0].chunk_id == "beida:0" and found[0].lexical_rank == 1


async def test_lexical_only_hits_get_text_and_metadata_from_the_store(retriever: Retriever) -> None:
    found = await retriever.search("Rockefeller", collection="docs", k=1, mode="lexical")
    assert found[0].chunk_id == "chicago:0" and found[0].metadata["chunk_index"] == 0 and "1890" in found[0].text


async def test_collection_filter(retriever: Retriever) -> None:
    docs = await retriever.search("University of Chicago", collection="docs", k=10)
    elsewhere = await retriever.search("University of Chicago", collection="elsewhere", k=10)
    assert "stray:0" not in chunk_ids(docs) and chunk_ids(elsewhere) == ["stray:0"]


async def test_document_filter(retriever: Retriever) -> None:
    found = await retriever.search("University of Chicago campus", collection="docs", k=5, doc_ids=["bowl", "volcano"])
    assert {c.doc_id for c in found} <= {"bowl", "volcano"}
    assert await retriever.search("Chicago", collection="docs", k=5, doc_ids=["beida"], mode="lexical") == []


async def test_the_names_no_searched_document_holds(retriever: Retriever) -> None:
    async def unknown(query: str, collection: str = "docs", doc_ids: list[str] | None = None) -> tuple[str, ...]:
        found = await retriever.search(query, collection=collection, k=3, doc_ids=doc_ids)
        assert found and len({c.unknown_names for c in found}) == 1, "one verdict per query"
        return found[0].unknown_names

    assert await unknown("When did Rockefeller found the University of Chicago?") == ()
    assert await unknown("When did MongoDB found the University of Chicago?") == ("MongoDB",)
    # Another collection's chunks, or the documents left out of the search, do not count.
    assert await unknown("Was the University of Chicago founded by Rockefeller?", "elsewhere") == ("Rockefeller",)
    assert await unknown("Did Rockefeller play Super Bowl 50?", doc_ids=["bowl"]) == ("Rockefeller",)
    assert await unknown("北京大学和 Hyde Park 有什么关系？") == ()
    assert await unknown("北京大学和 Stanford 有什么关系？") == ("Stanford",)


async def test_only_indexed_documents_are_returned(retriever: Retriever) -> None:
    catalog: DictCatalog = retriever.catalog  # type: ignore[assignment]
    catalog.states[("docs", "chicago")] = "deleting"
    found = await retriever.search("University of Chicago founded", collection="docs", k=5)
    assert found and all(c.doc_id != "chicago" for c in found)
    assert "chicago" in catalog.asked[-1]


async def test_dropped_hits_are_refilled_from_deeper_candidates(parts) -> None:
    settings, store, lexical = parts
    settings = settings.model_copy(update={"retrieval_depth": 2})
    catalog = DictCatalog()
    old = {f"old{i}": [f"Chicago report number {i} of the old version."] for i in range(6)}
    await index_docs(store, lexical, "docs", {**old, "new": ["Chicago report, the current version."]}, catalog)
    for doc_id in old:
        catalog.states[("docs", doc_id)] = "deleting"
    found = await Retriever(BagOfWordsEmbedder(), store, lexical, catalog, settings).search(
        "Chicago report", collection="docs", k=1
    )
    assert chunk_ids(found) == ["new:0"]


async def test_bad_mode_and_empty_queries(retriever: Retriever) -> None:
    with pytest.raises(InvalidRequest):
        await retriever.search("x", collection="docs", k=3, mode="sparse")
    assert await retriever.search("   ", collection="docs", k=3) == []
    assert await retriever.search("Chicago", collection="docs", k=0) == []
    retriever.store.collection("empty-one", create=True)
    assert await retriever.search("Chicago", collection="empty-one", k=3) == []
    with pytest.raises(NotFound):
        await retriever.search("Chicago", collection="never-made", k=3, mode="dense")


async def test_reranker_reorders_the_fused_head(parts) -> None:
    settings, store, lexical = parts
    catalog = DictCatalog()
    await index_docs(store, lexical, "docs", DOCS, catalog)
    reranker = ScriptedReranker()
    r = Retriever(BagOfWordsEmbedder(), store, lexical, catalog, settings, reranker=reranker)
    found = await r.search("University of Chicago neighborhood", collection="docs", k=2)
    assert chunk_ids(found) == ["chicago:1", "chicago:0"] and found[0].score == 1.0
    assert len(reranker.seen) == 1 and all(reranker.seen[0])


@pytest.mark.parametrize("error", [BackendUnavailable("down"), UpstreamError("bad answer")])
async def test_a_failing_reranker_keeps_the_fused_order(parts, error: Exception) -> None:
    settings, store, lexical = parts
    catalog = DictCatalog()
    await index_docs(store, lexical, "docs", DOCS, catalog)
    plain = Retriever(BagOfWordsEmbedder(), store, lexical, catalog, settings)
    failing = Retriever(BagOfWordsEmbedder(), store, lexical, catalog, settings, reranker=ScriptedReranker(error))
    query = "University of Chicago neighborhood"
    assert chunk_ids(await failing.search(query, collection="docs", k=3)) == chunk_ids(
        await plain.search(query, collection="docs", k=3)
    )


def test_no_reranker_unless_configured(tmp_path: Path) -> None:
    assert RerankClient.from_settings(Settings(data_dir=tmp_path)) is None
    client = RerankClient.from_settings(Settings(data_dir=tmp_path, reranker_url="http://127.0.0.1:9/"))
    assert client is not None and client.base_url == "http://127.0.0.1:9"


# ------------------------------------------------------------------ the rerank client


def rerank_transport(status: int, body: object, seen: list[dict]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, **json.loads(request.content)})
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler)


async def test_rerank_client_sends_jina_format_and_reorders_by_index() -> None:
    seen: list[dict] = []
    body = {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": -2.5}]}
    client = RerankClient("http://reranker", model="bge-reranker", transport=rerank_transport(200, body, seen))
    assert await client.rerank("q", ["a", "b"]) == [-2.5, 0.9]
    assert seen == [{"path": "/v1/rerank", "model": "bge-reranker", "query": "q", "documents": ["a", "b"], "top_n": 2}]
    assert await client.rerank("q", []) == []
    await client.aclose()


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (503, {"error": "loading"}, BackendUnavailable),
        (500, {"error": "boom"}, UpstreamError),
        (200, {"nothing": []}, UpstreamError),
        (200, {"results": [{"index": 0, "relevance_score": 1.0}]}, UpstreamError),  # one of two scored
    ],
)
async def test_rerank_client_errors(status: int, body: object, error: type[Exception]) -> None:
    client = RerankClient("http://reranker", model="m", transport=rerank_transport(status, body, []))
    with pytest.raises(error):
        await client.rerank("q", ["a", "b"])


async def test_rerank_client_unreachable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = RerankClient("http://reranker", model="m", transport=httpx.MockTransport(refuse))
    with pytest.raises(BackendUnavailable):
        await client.rerank("q", ["a"])


# ------------------------------------------------------------------ integration: the real embedding server


def sample(path: Path, paragraphs: int) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """The first paragraphs of a SQuAD-format set as one-chunk documents, with (question, doc_id) pairs."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    docs: dict[str, list[str]] = {}
    questions: list[tuple[str, str]] = []
    for article in raw["data"]:
        for paragraph in article["paragraphs"]:
            doc_id = f"p{len(docs):03d}"
            docs[doc_id] = [paragraph["context"]]
            questions += [(qa["question"], doc_id) for qa in paragraph["qas"][:2]]
            if len(docs) == paragraphs:
                return docs, questions
    return docs, questions


@pytest.mark.integration
@pytest.mark.parametrize(("dataset", "collection"), [(SQUAD, "squad"), (CMRC, "cmrc")], ids=["squad", "cmrc"])
async def test_hybrid_search_with_the_real_embedder_and_chroma(
    embedding_server, tmp_path: Path, dataset: Path, collection: str
) -> None:
    settings = Settings(data_dir=tmp_path, embed_url=embedding_server.url)
    docs, questions = sample(dataset, 40)
    embedder = EmbeddingClient(settings.embed_url, model=settings.embed_model)
    store = ChunkStore.open(settings)
    lexical = LexicalIndex(tmp_path / "lexical.sqlite")
    catalog = DictCatalog()
    texts = [chunks[0] for chunks in docs.values()]
    vectors = dict(zip(texts, await embedder.embed(texts)))
    await index_docs(store, lexical, collection, docs, catalog, embed=vectors.__getitem__)
    retriever = Retriever(embedder, store, lexical, catalog, settings)
    try:
        ranks = []
        for question, doc_id in questions[:30]:
            found = await retriever.search(question, collection=collection, k=5)
            ranks.append(next((r for r, c in enumerate(found, 1) if c.doc_id == doc_id), None))
            assert all(c.doc_id in docs and c.text for c in found)
        top1 = sum(r == 1 for r in ranks) / len(ranks)
        top5 = sum(r is not None for r in ranks) / len(ranks)
        assert top5 >= 0.9 and top1 >= 0.7, (top1, top5, ranks)
        # The right chunk for one hand-picked question comes first, with both ranks known.
        found = await retriever.search(questions[0][0], collection=collection, k=3)
        assert found[0].doc_id == questions[0][1] and found[0].lexical_rank is not None
    finally:
        lexical.close()
        await embedder.aclose()


async def test_every_hit_carries_the_share_of_the_query_terms_no_chunk_holds(retriever: Retriever) -> None:
    known = await retriever.search("When was the University of Chicago founded?", collection="docs", k=3)
    unknown = await retriever.search("Who painted the Quagmorphian frescoes?", collection="docs", k=3)
    assert known and {h.absent for h in known} == {0.0}
    assert unknown and len({h.absent for h in unknown}) == 1 and 0.5 < unknown[0].absent <= 1.0
