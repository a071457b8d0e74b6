"""Several slots and follow-ups that extend their prompt, against the real bundled llama-server run with -np 2."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag.answering.answer_stream import Answer
from rag.answering.answerer import Answerer, ChatQuery
from rag.answering.prompt import COMPLETION_EXAMPLES, SOURCES_CLOSE
from rag.clients.llm import LlamaServerClient
from rag.core.config import Settings
from tests.chat_helpers import OverlapRetriever
from tests.servers import Server, start_llama_server

CHUNKS = [
    ("eiffel.txt", "The Eiffel Tower in Paris was completed in 1889. Gustave Eiffel's company built it."),
    ("louvre.txt", "The Louvre in Paris opened as a museum in 1793. It holds the Mona Lisa."),
    ("arc.txt", "The Arc de Triomphe in Paris was completed in 1836. It honours the armies of France."),
    ("seine.txt", "The Seine flows through Paris. Many bridges cross it."),
]
FIRST = "When was the Eiffel Tower in Paris completed?"
FOLLOW_UP = "And when did the Louvre museum open, which holds the Mona Lisa?"


@pytest.fixture(scope="module")
def two_slot_llama(generator_model: Path, session_dir: Path) -> Iterator[Server]:
    """The bundled model with two slots of 4,096 tokens each (-c 8192 split in two), as the v100-16g profile runs."""
    server = start_llama_server(generator_model, session_dir, extra=["-c", "8192", "-np", "2"])
    yield server
    server.stop()


def run(coro_fn, server: Server, settings: Settings):
    async def go():
        llm = LlamaServerClient(server.url)
        answerer = Answerer(llm, OverlapRetriever(list(CHUNKS)), settings)
        try:
            return await coro_fn(answerer)
        finally:
            await llm.aclose()

    return asyncio.run(go())


def test_the_gate_and_the_budget_read_slots_and_context_from_llama_server(two_slot_llama: Server) -> None:
    async def two_at_once(answerer: Answerer):
        props = await answerer.props()
        query = ChatQuery([{"role": "user", "content": FIRST}], "default", 4, 16)
        answers = await asyncio.gather(answerer.start(query), answerer.start(query))
        admitted = (answerer.gate.active, answerer.gate.waiting)
        for started in answers:
            started.close()
        return props, answerer.gate.slots, admitted, [a.packed.n_ctx for a in answers]

    props, slots, admitted, packed_for = run(two_at_once, two_slot_llama, Settings())
    # Settings say nothing about slots: the numbers are llama-server's.
    assert (props.total_slots, props.n_ctx) == (2, 4096)
    assert slots == 2
    assert admitted == (2, 0)  # two users generate at once, nobody queued
    assert packed_for == [4096, 4096]  # every slot keeps the whole per-slot context


def sources_part(prompt: list[dict[str, str]] | str) -> str:
    """The sources block of a packed prompt: up to its closing tag (chat), or its context lines (completion)."""
    if isinstance(prompt, str):
        return prompt.removeprefix(COMPLETION_EXAMPLES).split("Question:")[0]
    first_user = next(m["content"] for m in prompt if m["role"] == "user")
    return first_user[: first_user.index(SOURCES_CLOSE) + len(SOURCES_CLOSE)]


@pytest.mark.parametrize("style", ["chat", "completion"])
def test_a_follow_up_prompt_starts_with_the_previous_prompts_sources(two_slot_llama: Server, style: str) -> None:
    settings = Settings(llm_prompt_style=style, pack_relative_score=0, completion_max_sources=4)

    async def turns(answerer: Answerer, remembered: bool = True):
        first = await answerer.start(ChatQuery([{"role": "user", "content": FIRST}], "default", 4, 16))
        assert isinstance(first, Answer)
        first.close()
        if not remembered:
            answerer.sent = type(answerer.sent)()  # another API process: it has not seen the first turn
        history = [
            {"role": "user", "content": FIRST},
            {"role": "assistant", "content": "It was completed in 1889 [S1]."},
            {"role": "user", "content": FOLLOW_UP},
        ]
        follow = await answerer.start(ChatQuery(history, "default", 4, 16))
        assert isinstance(follow, Answer)
        follow.close()
        return first.packed, follow.packed

    first, follow = run(turns, two_slot_llama, settings)
    before = sources_part(first.messages)
    assert first.chunks[0].candidate.chunk_id.startswith("eiffel")  # the first question ranked it first
    if style == "completion":  # a base model's follow-up is asked alone (Answerer.asks_alone): no prefix kept
        assert not sources_part(follow.messages).startswith(before) and follow.kept_turns == 0
        return
    assert sources_part(follow.messages).startswith(before)  # byte for byte, counted by the real tokenizer
    assert [c.candidate.chunk_id for c in follow.chunks][: len(first.chunks)] == [
        c.candidate.chunk_id for c in first.chunks
    ]
    assert follow.kept_turns == 1  # the history is kept too

    # Without the first turn's memory the follow-up ranks the Louvre first: the prefix would be lost.
    _, fresh = run(lambda a: turns(a, remembered=False), two_slot_llama, settings)
    assert not sources_part(fresh.messages).startswith(before)
