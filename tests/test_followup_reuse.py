"""A follow-up to a first turn whose sources fill the budget reuses the first prompt on a hybrid model.

A real llama-server (the CPU build) serves a tiny qwen35 (Gated DeltaNet + attention, the production
model's architecture) with the GPU profile's flags; llama-server can roll its recurrent state back only
to checkpoints, so a follow-up that cuts the first prompt's last source earlier processes everything
after the system prompt again. The prompts are packed by the real budget and ordered by the real
continuation map, as the API does, and sent through the real client.
"""

from __future__ import annotations

import asyncio

import pytest

from rag.answering.budget import Candidate, PromptBudget
from rag.answering.continuation import Sent, SentSources
from rag.answering.retrieval import RetrievedChunk
from rag.clients.llm import LlamaServerClient, StreamDelta, StreamEnd
from rag.deploy.model_shapes import qwen35_model, write_gguf
from rag.deploy.profiles import PROFILES
from tests.servers import start_llama_server
from tests.test_planner import TINY_QWEN35

N_CTX = 4096  # each of the profile's two slots
ANSWER = 64
PARAGRAPH = (
    "The bridge over the river was opened in the spring of that year after four years of work. "
    "Its main span is carried by two towers of stone and steel, and the deck holds four lanes. "
    "Engineers tested the cables every month during the first winter, when the ice was thickest. "
    "A museum beside the northern tower tells the story of the workers who built it. "
)


@pytest.fixture(scope="module")
def hybrid_server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("hybrid")
    model = write_gguf(qwen35_model(TINY_QWEN35, "Q4_K_S", name="tiny-qwen35"), tmp / "tiny-qwen35.gguf")
    server = start_llama_server(model, tmp, profile="v100-16g", alias="tiny-qwen35")
    yield server
    server.stop()


def hits(topic: str) -> list[RetrievedChunk]:
    """Retrieved chunks in rank order, more than the budget holds; each conversation has its own, so it
    finds nothing of another's in the slots but the system prompt."""
    return [
        RetrievedChunk(
            f"doc:{i}", f"doc{i}", f"{topic}, part {i}. " + PARAGRAPH * 3, {"source": f"file{i}.txt"}, 1.0, 1, 1
        )
        for i in range(40)
    ]


async def turn(
    client: LlamaServerClient, sent: SentSources, history: list[dict[str, str]], question: str, room: int
) -> tuple[str, dict, object]:
    """One turn as the API takes it: sources ordered by the conversation's last prompt, packed, answered."""
    key = "conversation" if history else None
    ordered = sent.order(key, hits(f"Bridge {room}"))
    candidates = [
        Candidate(f"S{i}", h.chunk_id, text, h.metadata)
        for i, (h, text) in enumerate(zip(ordered.hits, ordered.texts), 1)
    ]
    packed = await PromptBudget(client).pack(
        question=question,
        candidates=candidates,
        history=history,
        n_ctx=N_CTX,
        reserve=ANSWER,
        history_share=0.25,
        followup_room=room,
    )
    whole = {c.chunk_id: c.text.strip() for c in candidates}
    sent.remember(
        "conversation",
        [
            Sent(c.candidate.chunk_id, len(c.text) if len(c.text) < len(whole[c.candidate.chunk_id]) else None)
            for c in packed.chunks
        ],
    )
    text, timings = [], {}
    assert isinstance(packed.messages, list)
    async for item in client.stream_chat(packed.messages, max_tokens=ANSWER, temperature=0.0):
        if isinstance(item, StreamDelta):
            text.append(item.text)
        elif isinstance(item, StreamEnd):
            timings = item.timings
    return "".join(text), timings, packed


async def conversation(url: str, room: int) -> tuple[float, object, object, int]:
    """A first turn, then a follow-up carrying the whole first answer; the follow-up's reuse."""
    client = LlamaServerClient(url, model="tiny-qwen35")
    try:
        sent = SentSources()
        q1 = f"When was the bridge opened (room {room})?"
        answer, _, first = await turn(client, sent, [], q1, room)
        history = [{"role": "user", "content": q1}, {"role": "assistant", "content": answer}]
        _, timings, second = await turn(client, sent, history, "And who built it?", room)
        reuse = timings["cache_n"] / (timings["cache_n"] + timings["prompt_n"])
        return reuse, first, second, timings["cache_n"]
    finally:
        await client.aclose()


def test_a_follow_up_extends_a_first_turn_that_left_it_room(hybrid_server) -> None:
    reuse, first, second, _ = asyncio.run(conversation(hybrid_server.url, 512))
    print(f"follow-up reuse with the room held: {reuse:.3f} ({first.used} then {second.used} prompt tokens)")
    assert any(d["reason"] == "budget" for d in first.dropped)  # the sources filled the budget
    assert first.used <= first.limit - 512 + first.question and first.followup_room_held > 0
    assert second.kept_turns == 1 and second.used <= second.limit
    assert [c.text for c in second.chunks] == [c.text for c in first.chunks]  # the same sources, cut alike
    assert reuse >= 0.8, reuse


def test_without_the_room_the_follow_up_cuts_its_sources_and_rolls_back_to_a_checkpoint(hybrid_server) -> None:
    """The follow-up's turn pair pushes the last source's cut back; llama-server cannot extend the first prompt
    and restores a checkpoint: the one 4 + -ub tokens before its end when the cut lies after it (reuse 0.87 here
    at the profile's -ub 512), else the system prompt's (reuse 0.10 on an H200 machine at -ub 256)."""
    reuse, first, second, cache_n = asyncio.run(conversation(hybrid_server.url, 0))
    print(f"follow-up reuse without the room: {reuse:.3f} ({first.used} then {second.used} prompt tokens)")
    assert any(d["reason"] == "budget" for d in first.dropped) and second.kept_turns == 1
    assert second.chunks[-1].text != first.chunks[-1].text  # the last source cut earlier for the turn pair
    assert cache_n <= first.used - 4 - PROFILES["v100-16g"].ubatch, (cache_n, first.used)
