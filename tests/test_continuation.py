"""The sources a conversation's last prompt sent, and the order a follow-up's retrieved chunks take from them."""

from __future__ import annotations

from rag.answering.continuation import Sent, SentSources, questions_so_far_key, user_turns
from rag.answering.retrieval import RetrievedChunk


def hit(chunk_id: str, text: str = "One sentence. Two sentences. Three.") -> RetrievedChunk:
    return RetrievedChunk(chunk_id, "doc", text, {}, 1.0, 1, 1)


def test_previous_sources_lead_in_their_order_then_the_rest_by_rank() -> None:
    sent = SentSources()
    sent.remember("k", [Sent("b"), Sent("a")])
    ordered = sent.order("k", [hit("a"), hit("c"), hit("b"), hit("d")])
    assert [h.chunk_id for h in ordered.hits] == ["b", "a", "c", "d"]
    assert ordered.kept == 2


def test_a_source_sent_cut_is_offered_cut_the_same_way_and_a_missing_one_is_skipped() -> None:
    sent = SentSources()
    sent.remember("k", [Sent("gone"), Sent("a", cut_chars=len("One sentence."))])
    ordered = sent.order("k", [hit("z"), hit("a")])
    assert [h.chunk_id for h in ordered.hits] == ["a", "z"]
    assert ordered.texts == ["One sentence.", "One sentence. Two sentences. Three."]


def test_no_key_or_an_unknown_one_keeps_the_rank_order() -> None:
    sent = SentSources()
    hits = [hit("a"), hit("b")]
    assert [h.chunk_id for h in sent.order(None, hits).hits] == ["a", "b"]
    assert sent.order("unknown", hits).kept == 0


def test_the_map_is_bounded_and_forgets_the_least_recently_used() -> None:
    sent = SentSources(size=2)
    sent.remember("one", [Sent("a")])
    sent.remember("two", [Sent("b")])
    sent.previous("one")
    sent.remember("three", [Sent("c")])
    assert sent.previous("two") == [] and sent.previous("one") == [Sent("a")]


def test_the_key_is_the_user_turns_in_their_collection_and_filter() -> None:
    turns = user_turns(
        [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    )
    assert turns == ["q1", "q2"]
    key = questions_so_far_key("default", None, turns)
    assert key == questions_so_far_key("default", None, ["q1", "q2"])
    assert key != questions_so_far_key("other", None, turns)
    assert key != questions_so_far_key("default", ["doc"], turns)


def test_replicas_of_one_database_share_what_the_last_prompt_sent(database_url: str) -> None:
    """The first turn went through one replica, the follow-up through another: it still finds the order
    and the cut of the previous prompt's sources (in PostgreSQL)."""
    import asyncio

    from rag.answering.shared_sent import SharedSentSources

    first, second = SharedSentSources(database_url), SharedSentSources(database_url)
    cut = len("One sentence.")
    asyncio.run(first.keep("k", [Sent("b"), Sent("a", cut_chars=cut)]))
    ordered = asyncio.run(second.recall("k", [hit("a"), hit("c"), hit("b")]))
    assert [h.chunk_id for h in ordered.hits] == ["b", "a", "c"] and ordered.kept == 2
    assert ordered.texts[1] == "One sentence."
    asyncio.run(second.keep("k", [Sent("c")]))  # the conversation's newer turn, through the second replica
    assert asyncio.run(first.recall("k", [hit("a"), hit("c")])).kept == 1
    assert asyncio.run(first.recall("unknown", [hit("a")])).kept == 0
