"""The completion style's answer line is withheld when the model wrote it with too low a likelihood (the
geometric mean of its tokens' probabilities, which llama-server sends when asked): the reply then says the
sources do not answer clearly and names them (rag.answering.no_answer). Over a replayed llama-server here;
tests/test_no_answer.py has it on the real one."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from rag.answering.answer_stream import likelihood
from rag.answering.answerer import Answerer, ChatQuery
from rag.answering.no_answer import UNSURE_ANSWER, UNSURE_ANSWER_ZH
from rag.clients.llm import LlamaServerClient
from rag.core.config import Settings
from tests.chat_helpers import OverlapRetriever, ReplayLlamaServer

TOWER = [("eiffel.txt", "The Eiffel Tower is in Paris. It was completed in 1889.")]
WALL = [("wall.txt", "长城，东起山海关，西至嘉峪关。")]  # the overlap retriever matches "长城"
COMPLETION = Settings(llm_prompt_style="completion", completion_likelihood_floor=0.08)


def answer(
    server: ReplayLlamaServer,
    question: str = "When was the tower in Paris completed?",
    *,
    chunks: list[tuple[str, str]] = TOWER,
    settings: Settings = COMPLETION,
) -> tuple[str, dict[str, Any]]:
    """The answer's text and its events by name."""

    async def go() -> list[Any]:
        llm = LlamaServerClient("http://llama.test", transport=server.transport())
        answerer = Answerer(llm, OverlapRetriever(list(chunks)), settings)
        try:
            started = await answerer.start(ChatQuery([{"role": "user", "content": question}], "default", 8, None))
            return [e async for e in started.events()]
        finally:
            await llm.aclose()

    events = asyncio.run(go())
    return "".join(e.data["text"] for e in events if e.name == "token"), {e.name: e.data for e in events}


def test_a_line_the_model_found_unlikely_is_withheld_and_the_sources_are_named():
    server = ReplayLlamaServer("1889", logprob=math.log(0.05))
    text, data = answer(server)
    assert text == UNSURE_ANSWER.format(names="eiffel.txt")
    assert data["done"]["unsure"] is True and data["done"]["likelihood"] == pytest.approx(0.05)
    assert data["citations"]["citations"] == [] and data["done"]["unsupported_sentences"] == 0
    assert server.requests[-1]["logprobs"] == 1  # asked of llama-server with the line itself


def test_a_line_the_model_wrote_confidently_is_shown_with_its_likelihood():
    text, data = answer(ReplayLlamaServer("1889", logprob=math.log(0.6)))
    assert text == "1889"
    assert data["done"]["unsure"] is False and data["done"]["likelihood"] == pytest.approx(0.6)
    assert [c["source"] for c in data["citations"]["citations"]] == ["eiffel.txt"]


def test_a_chinese_question_is_told_in_chinese():
    server = ReplayLlamaServer("山海关", logprob=math.log(0.01))
    settings = Settings(
        llm_prompt_style="completion", completion_likelihood_floor=0.08, min_relevance_cjk=0, refusal_rule="floor"
    )
    text, data = answer(server, "长城，东起哪里？", chunks=WALL, settings=settings)
    assert text == UNSURE_ANSWER_ZH.format(names="wall.txt") and data["done"]["unsure"] is True


def test_a_server_that_sends_no_likelihood_has_its_line_shown():
    text, data = answer(ReplayLlamaServer("1889"))
    assert text == "1889" and data["done"]["unsure"] is False and data["done"]["likelihood"] is None


def test_a_floor_of_zero_shows_every_line():
    server = ReplayLlamaServer("1889", logprob=math.log(0.001))
    text, data = answer(server, settings=Settings(llm_prompt_style="completion", completion_likelihood_floor=0))
    assert text == "1889" and data["done"]["unsure"] is False and data["done"]["likelihood"] == pytest.approx(0.001)


def test_the_likelihood_is_the_geometric_mean_of_the_token_probabilities():
    assert likelihood([math.log(0.5), math.log(0.125)]) == pytest.approx(0.25)
    assert likelihood([]) is None and likelihood(None) is None


def test_the_floor_is_the_bundled_generators_while_it_is_served_and_off_for_another_model(tmp_path):
    assert Settings(data_dir=tmp_path).completion_likelihood_floor == 0.08
    assert Settings(data_dir=tmp_path, generator="smollm2-135m-instruct").completion_likelihood_floor == 0.0
    assert Settings(data_dir=tmp_path, llm_model="qwen2.5-7b-base").completion_likelihood_floor == 0.0
    assert Settings(data_dir=tmp_path, completion_likelihood_floor=0.2).completion_likelihood_floor == 0.2
