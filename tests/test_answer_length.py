"""A chat answer of a small instruct model ends near its fact: after its first sentences, or at a blank line
(rag.answering.answer_stream._until_sentences); the stream logic alone, over a scripted stream of pieces."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rag.answering.answer_stream import _until_sentences
from rag.clients.llm import StreamDelta, StreamEnd


async def _pieces(parts: list[str], closed: list[bool]) -> AsyncIterator[StreamDelta | StreamEnd]:
    try:
        for part in parts:
            yield StreamDelta(part)
        yield StreamEnd("length")
    finally:
        closed.append(True)


def run(parts: list[str], limit: int) -> tuple[str, StreamEnd, bool]:
    async def go() -> tuple[str, StreamEnd, bool]:
        closed: list[bool] = []
        items = [item async for item in _until_sentences(_pieces(parts, closed), limit, 100)]
        text = "".join(i.text for i in items if isinstance(i, StreamDelta))
        ends = [i for i in items if isinstance(i, StreamEnd)]
        assert len(ends) == 1 and items[-1] is ends[0]
        return text, ends[0], bool(closed)

    return asyncio.run(go())


RUN_ON = ["The city", " became the capital", " in 1596.", " It was", " later moved.", " Then", " again", " and again."]


def test_the_answer_ends_after_its_second_sentence_and_generation_stops():
    text, end, closed = run(RUN_ON, 2)
    assert text == "The city became the capital in 1596. It was later moved."
    assert end.finish_reason == "stop" and end.usage["completion_tokens"] == 6 and closed


def test_a_blank_line_after_text_ends_it():
    text, end, _ = run(["Warsaw [S1].", "\n\n", "Note: the sources", " say more."], 2)
    assert text == "Warsaw [S1]." and end.finish_reason == "stop"


def test_an_answer_within_the_limit_keeps_the_models_own_end():
    text, end, _ = run(["Dr. Smith", " built it."], 2)
    assert text == "Dr. Smith built it." and end.finish_reason == "length"


@pytest.mark.parametrize("limit", [0])
def test_no_limit_passes_everything(limit: int):
    text, end, _ = run(RUN_ON, limit)
    assert text == "".join(RUN_ON) and end.finish_reason == "length"
