"""The "not in the documents" decision (rag.answering.coverage_rule): the relevance floor and the signal model."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rag.answering.answerer import Answerer, ChatQuery
from rag.answering.coverage_rule import COEFFICIENTS, FEATURES, covered, covered_probability, signals
from rag.answering.retrieval import RetrievedChunk
from rag.clients.llm import LlamaServerClient
from rag.core.config import BUNDLED_EMBEDDERS, MULTILINGUAL_E5, Settings
from tests.chat_helpers import ReplayLlamaServer

# Two real questions of the held-out split of bench/refusal.py (multilingual-e5-small, top 8, SQuAD dev): each
# hit as (cosine, coverage, dense rank, BM25 rank, absent), in the fused order.
OTHER_ARTICLE = (  # asked of the collection of half the articles, its own article not among them
    "What was Nicholas Storch ?",
    [
        (0.8101, 0.0, 1, None, 0.5831),
        (0.7817, 0.4169, 29, 1, 0.5831),
        (0.7892, 0.4169, 7, 2, 0.5831),
        (0.8057, 0.0, 2, None, 0.5831),
        (0.7933, 0.0, 3, None, 0.5831),
        (0.7899, 0.0, 4, None, 0.5831),
        (0.7893, 0.0, 5, None, 0.5831),
        (0.7892, 0.0, 6, None, 0.5831),
    ],
)
ITS_ARTICLE = (  # asked of the same collection, which holds its article
    "When did Kenya obtain independence?",
    [
        (0.9102, 1.0, 2, 1, 0.0),
        (0.9154, 0.6072, 1, 3, 0.0),
        (0.8914, 0.6072, 3, 2, 0.0),
        (0.8557, 1.0, 5, 4, 0.0),
        (0.8733, 0.6072, 4, 6, 0.0),
        (0.8508, 0.3084, 6, 15, 0.0),
        (0.8254, 0.6072, 11, 8, 0.0),
        (0.8117, 0.6072, 25, 5, 0.0),
    ],
)
Recorded = list[tuple[float | None, float, int | None, int | None, float]]


def hits(rows: Recorded) -> list[RetrievedChunk]:
    return [
        RetrievedChunk(f"d{i}:0", f"d{i}", "text", {}, 1.0 - i / 10, dense, lexical, cosine, coverage, absent)
        for i, (cosine, coverage, dense, lexical, absent) in enumerate(rows)
    ]


def test_every_bundled_embedder_has_a_complete_coefficient_set() -> None:
    for name in BUNDLED_EMBEDDERS:
        assert set(COEFFICIENTS[name]) == {"intercept", "threshold", "named_threshold", *FEATURES}, name
        assert 0 < COEFFICIENTS[name]["threshold"] <= COEFFICIENTS[name]["named_threshold"] < 1


def test_the_signals_read_the_dense_top_its_gap_the_coverage_and_the_rank_agreement() -> None:
    found = signals(
        "When was it built?",
        hits([(0.9, 0.5, 1, 1, 0.25), (0.7, 1.0, 2, None, 0.25), (None, 0.25, None, 2, 0.25), (0.6, 0.0, 3, 9, 0.25)]),
    )
    assert found["cosine"] == pytest.approx(0.9)
    assert found["cosine_gap"] == pytest.approx(0.3)  # over the k-th cosine among the hits
    assert found["coverage"] == 1.0 and found["top_coverage"] == 0.5
    assert found["agreement"] == pytest.approx(1 / 5)  # one chunk in both top fives
    assert found["absent"] == 0.25 and found["cjk"] == 0 and found["cjk_cosine"] == 0
    assert signals("它是什么时候建的", hits([(0.9, 0.5, 1, 1, 0.0)]))["cjk_coverage"] == pytest.approx(0.5)


def test_a_question_about_another_article_is_refused_and_one_about_its_article_answered() -> None:
    settings = Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model")
    other_question, other_hits = OTHER_ARTICLE
    own_question, own_hits = ITS_ARTICLE
    assert not covered(other_question, hits(other_hits), settings)
    assert covered(own_question, hits(own_hits), settings)
    # today's floor lets the other article's question through: the model is what refuses it
    assert covered(other_question, hits(other_hits), Settings(embed_model=MULTILINGUAL_E5, refusal_rule="floor"))


def test_a_question_naming_what_no_chunk_holds_must_pass_the_higher_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    question, rows = ITS_ARTICLE
    p = covered_probability(signals(question, hits(rows)), COEFFICIENTS[MULTILINGUAL_E5])
    named = [dataclasses.replace(h, unknown_names=("Kenya",)) for h in hits(rows)]
    settings = Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model")
    for named_threshold, kept in ((p - 0.01, True), (p + 0.001, False)):
        monkeypatch.setitem(
            COEFFICIENTS, MULTILINGUAL_E5, COEFFICIENTS[MULTILINGUAL_E5] | {"named_threshold": named_threshold}
        )
        assert covered(question, named, settings) is kept
        assert covered(question, hits(rows), settings), "a question whose names the chunks hold reads the threshold"
        assert covered(question, named, Settings(embed_model=MULTILINGUAL_E5, refuse_unknown_names=False))


def test_a_floor_of_zero_turns_refusal_off_under_the_model_rule_too() -> None:
    other_question, other_hits = OTHER_ARTICLE
    off = Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model", min_relevance=0)
    assert covered(other_question, hits(other_hits), off)
    chinese = Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model", min_relevance_cjk=0)
    assert covered("长城有多长？", hits([(0.1, 0.0, 1, None, 1.0)]), chinese)
    assert not covered(other_question, hits(other_hits), chinese)  # the English floor still stands


def test_the_probability_grows_with_the_dense_top_and_the_coverage() -> None:
    coefficients = COEFFICIENTS[MULTILINGUAL_E5]
    low = signals("Who built it?", hits([(0.80, 0.2, 1, 4, 0.0), (0.79, 0.2, 2, 1, 0.0)]))
    high = signals("Who built it?", hits([(0.90, 0.9, 1, 1, 0.0), (0.79, 0.2, 2, 2, 0.0)]))
    assert covered_probability(low, coefficients) < covered_probability(high, coefficients)


def test_no_hits_is_never_covered_and_an_embedder_without_coefficients_uses_the_floor() -> None:
    assert not covered("anything", [], Settings(refusal_rule="model"))
    other = Settings(embed_model="another-model", refusal_rule="model", min_relevance=0.5)
    assert other.embed_model not in COEFFICIENTS
    assert covered("when was it built", hits([(0.9, 0.9, 1, 1, 0.0)]), other)
    assert not covered("when was it built", hits([(0.1, 0.1, 1, 1, 0.0)]), other)


def test_hits_without_a_dense_score_are_judged_by_the_floor() -> None:
    lexical_only = hits([(None, 0.9, None, 1, 0.0)])  # BM25 found it; the model's cosine would read 0
    model = Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model", min_relevance=0.1)
    assert covered("when was it built", lexical_only, model)
    assert not covered("when was it built", hits([(None, 0.2, None, 1, 0.0)]), model)


def test_a_refused_question_gets_the_fixed_answer_without_the_model() -> None:
    server = ReplayLlamaServer("should never be said")
    other_question, other_hits = OTHER_ARTICLE

    class Recorded:
        async def search(self, query: str, *, collection: str, k: int, doc_ids: object = None) -> list[RetrievedChunk]:
            return hits(other_hits)

    async def go() -> dict[str, dict]:
        llm = LlamaServerClient("http://llama.test", transport=server.transport())
        try:
            answerer = Answerer(llm, Recorded(), Settings(embed_model=MULTILINGUAL_E5, refusal_rule="model"))
            started = await answerer.start(ChatQuery([{"role": "user", "content": other_question}], "default", 8, 64))
            return {e.name: e.data for e in [e async for e in started.events()]}
        finally:
            await llm.aclose()

    refused = asyncio.run(go())
    assert refused["sources"]["sources"] == [] and refused["done"]["no_sources"] == "not_relevant"
    assert {d["reason"] for d in refused["budget"]["dropped"]} == {"below_min_relevance"}
    assert server.prompts == []
