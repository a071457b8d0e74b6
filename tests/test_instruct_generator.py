"""The chat prompt style against a real instruct model: the bundled SmolLM2 135M Instruct in llama-server,
greedy (temperature 0, seed 0), nothing forced by a grammar.

A 135M model is not reliable on its own, so each test checks what the stack guarantees around it: the
citations it writes are parsed and checked against the prompt, the refusal needs no model, the follow-up
query searched is the generator's and is shown.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from rag.answering.prompt import no_sources_answer
from rag.core.config import Settings
from tests.chat_helpers import chat_events, prompt_tokens_total, serve, upload
from tests.servers import Server

pytestmark = pytest.mark.integration


@pytest.fixture
def instruct_settings(instruct_llama_server: Server, embedding_server: Server, isolated_env) -> Settings:
    return Settings(
        data_dir=isolated_env,
        generator="smollm2-135m-instruct",
        llm_url=instruct_llama_server.url,
        embed_url=embedding_server.url,
    )


def chat(url: str, messages: list[dict[str, str]], max_tokens: int = 64) -> dict[str, Any]:
    events = chat_events(url, {"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    data = {e.event: e.data for e in events}
    data["answer"] = "".join(e.data["text"] for e in events if e.event == "token")
    return data


def test_the_instruct_model_is_served_in_the_chat_style(instruct_settings: Settings) -> None:
    import httpx

    with serve(instruct_settings) as url:
        health = httpx.get(f"{url}/health", timeout=30).json()
        models = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]
    assert health["backends"]["llm"]["prompt_style"] == "chat"
    assert "smollm2-135m-instruct" in models


def test_a_sourced_answer_carries_the_models_own_citation_parsed_and_checked(instruct_settings: Settings) -> None:
    # Earlier answers that cite show the model the form: a 135M model then cites in its own answer. Two of
    # them: after one, the model's greedy answer cites or not by the CPU's matrix kernels (AMX, AVX-512).
    conversation = [
        {"role": "user", "content": "Which countries does the Amazon River flow through?"},
        {"role": "assistant", "content": "The Amazon flows through Peru, Colombia and Brazil [S1]."},
        {"role": "user", "content": "What covers much of the river's basin?"},
        {"role": "assistant", "content": "The Amazon rainforest covers much of the basin [S1]."},
        {"role": "user", "content": "Where does the Amazon River rise?"},
    ]
    with serve(instruct_settings) as url:
        upload(url)
        data = chat(url, conversation)
    assert data["done"]["style"] == "chat" and data["done"]["finish_reason"] == "stop"
    sources = {s["id"]: s for s in data["sources"]["sources"]}
    assert sources["S1"]["source"] == "amazon.txt"
    written = set(re.findall(r"\[(S\d+)\]", data["answer"]))
    assert written, f"the model wrote no citation: {data['answer']!r}"
    model = [c for c in data["citations"]["citations"] if c["kind"] == "model"]
    flagged = set(data["citations"]["invalid"]) | set(data["citations"]["echoed"])
    # Every id the model wrote is a source of the prompt resolved to its chunk, or flagged (not in the
    # prompt, or inside a sentence that repeats our own prompt text).
    assert {c["id"] for c in model} | flagged == written
    for citation in model:
        assert citation["chunk_id"] == sources[citation["id"]]["chunk_id"]
        assert citation["source"] == sources[citation["id"]]["source"]
    assert "Andes" in data["answer"]


def test_a_question_the_documents_do_not_cover_is_refused_without_the_model(
    instruct_settings: Settings, instruct_llama_server: Server
) -> None:
    with serve(instruct_settings) as url:
        upload(url)
        before = prompt_tokens_total(instruct_llama_server.url)
        english = chat(url, [{"role": "user", "content": "Who won the 2014 FIFA World Cup final?"}])
        chinese = chat(url, [{"role": "user", "content": "二〇一四年世界杯决赛谁赢了？"}])
        assert prompt_tokens_total(instruct_llama_server.url) == before, "no generation"
    for data in (english, chinese):
        assert data["sources"]["sources"] == [] and data["citations"]["citations"] == []
    assert english["done"]["no_sources"] == "not_mentioned" and chinese["done"]["no_sources"] == "not_relevant"
    assert english["answer"] == no_sources_answer("default", "Who won the 2014 FIFA World Cup final?", ["FIFA", "Cup"])
    assert chinese["answer"] == no_sources_answer("default", "二〇一四年世界杯决赛谁赢了？")


def test_the_generator_rewrites_a_follow_up_into_the_query_searched(instruct_settings: Settings) -> None:
    from tests.chat_helpers import changed

    conversation = [
        {"role": "user", "content": "Which countries does the Amazon River flow through?"},
        {"role": "assistant", "content": "Peru, Colombia and Brazil [S1]."},
        {"role": "user", "content": "Where does it rise?"},
    ]
    with serve(changed(instruct_settings, followup_rewrite="generator")) as url:
        upload(url)
        data = chat(url, conversation, max_tokens=32)
    search = data["sources"]
    assert search["rewrite"] == "generator", "the model's rewrite, not the rule's fallback"
    assert search["query"] and search["query"] != "Where does it rise?"
    assert "\n" not in search["query"] and len(search["query"]) <= 400
    assert search["sources"] and search["sources"][0]["source"] == "amazon.txt"
