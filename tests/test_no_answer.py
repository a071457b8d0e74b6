"""Never a blank answer: a reply with nothing usable is retried (completion style), else said in words."""

from __future__ import annotations

import httpx
import pytest

from rag.answering.no_answer import UNSURE_ANSWER, counts_up, echoes, usable
from rag.core.config import Settings
from tests.chat_helpers import ask, changed, chat_events, parse_sse, serve, upload

LIGHTHOUSE = {"lighthouse.txt": "The lighthouse keeper lives on Skerry Island. She lights the lamp at dusk.\n"}
NO_ANSWER = "The model gave no answer; see the sources (lighthouse.txt)."


@pytest.mark.parametrize("text", ["", "  \n", "...", " - ", "「」", "—?"])
def test_blanks_and_punctuation_are_no_answer(text: str):
    assert not usable(text)


@pytest.mark.parametrize("text", ["1887", "十八棵", "a", " (b)"])
def test_a_letter_or_digit_of_any_script_is_an_answer(text: str):
    assert usable(text)


def test_a_completion_that_ends_its_line_at_once_is_tried_again_and_answers(
    forced_llama_server, backend_settings: Settings
):
    # The server's grammar makes every first attempt a newline (what the base model sometimes writes
    # first): the newline stop ends it with no text. The retry's own grammar overrides the server's.
    forced = forced_llama_server("\n")
    with serve(changed(backend_settings, llm_url=forced.url)) as url:
        upload(url, LIGHTHOUSE)
        events = chat_events(url, ask("Where does the lighthouse keeper live?", max_tokens=16))
    tokens = [e.data["text"] for e in events if e.event == "token"]
    done = next(e.data for e in events if e.event == "done")
    assert done["style"] == "completion" and done["retried"] is True and done["no_answer"] is False
    assert tokens and all(usable(t) for t in tokens[:1]) and usable("".join(tokens))
    assert "".join(tokens) != NO_ANSWER


def test_nothing_usable_is_said_in_words_naming_the_sources_on_every_endpoint(
    forced_llama_server,
    backend_settings: Settings,
):
    # A chat-style reply of punctuation alone: no retry in that style, so the fixed line stands in.
    forced = forced_llama_server(" . . .")
    with serve(changed(backend_settings, llm_url=forced.url, llm_prompt_style="chat")) as url:
        upload(url, LIGHTHOUSE)
        question = ask("Where does the lighthouse keeper live?", max_tokens=16)
        events = chat_events(url, question)
        whole = httpx.post(f"{url}/v1/chat", json={**question, "stream": False}, timeout=300).json()
        openai_body = {"model": "gemma-3-270m-q4_k_m", "messages": question["messages"], "max_tokens": 16}
        completion = httpx.post(f"{url}/v1/chat/completions", json=openai_body, timeout=300).json()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**openai_body, "stream": True}, timeout=300) as r:
            chunks = [e.data for e in parse_sse(r.iter_lines()) if e.data != "[DONE]"]
    assert [e.data["text"] for e in events if e.event == "token"] == [NO_ANSWER]  # the dots never reach a client
    done = next(e.data for e in events if e.event == "done")
    assert done["no_answer"] is True and done["style"] == "chat"
    citations = next(e.data for e in events if e.event == "citations")
    assert citations["citations"] == [] and citations["sentences"] == []  # our own line claims nothing
    assert [s["source"] for s in next(e.data for e in events if e.event == "sources")["sources"]] == ["lighthouse.txt"]
    assert whole["answer"] == NO_ANSWER and whole["done"]["no_answer"] is True
    assert completion["choices"][0]["message"]["content"] == NO_ANSWER
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")) == NO_ANSWER


@pytest.mark.parametrize(
    ("answer", "question"),
    [
        ("1.", "Which ITU-T recommendation specifies ASN.1?"),
        ("长城东起哪里", "长城东起哪里？"),
        ("ITU-T recommendation specifies", "which ITU-T recommendation specifies ASN.1?"),
    ],
)
def test_an_answer_that_only_repeats_its_question_is_an_echo(answer: str, question: str):
    assert echoes(answer, question)


@pytest.mark.parametrize(
    ("answer", "question"),
    [
        ("X.680", "Which ITU-T recommendation specifies ASN.1?"),
        ("Paris", "Is the tower in Paris or in Rome?"),
        ("-m", "Which useradd option creates the user's home directory?"),  # "m" is in "home", no word of it
    ],
)
def test_an_answer_of_the_sources_or_a_choice_is_no_echo(answer: str, question: str):
    assert not echoes(answer, question)


def test_a_completion_that_echoes_the_question_is_tried_again_without_its_first_token(
    forced_llama_server, backend_settings: Settings
):
    # The server's grammar makes every first attempt "1" (what the base model answered from "ASN.1");
    # the retry's own grammar overrides it, and the token of "1" is forbidden.
    forced = forced_llama_server("1")
    docs = {"asn1.txt": "The ASN.1 notation is specified in ITU-T Recommendation X.680; its encoding rules in X.690.\n"}
    with serve(changed(backend_settings, llm_url=forced.url)) as url:
        upload(url, docs)
        events = chat_events(url, ask("Which ITU-T recommendation specifies ASN.1?", max_tokens=16))
    answer = "".join(e.data["text"] for e in events if e.event == "token")
    done = next(e.data for e in events if e.event == "done")
    assert done["retried"] is True and done["no_answer"] is False
    assert usable(answer) and not answer.startswith("1")


def test_a_span_the_model_finds_unlikely_is_withheld_and_the_sources_are_named(
    forced_llama_server, llama_server, backend_settings: Settings
):
    # The grammar forces "dusk", a span of the source, to where the keeper lives: llama-server's
    # probabilities are the model's own (before the grammar), and it would not have written it.
    forced = forced_llama_server("dusk")
    question = ask("Where does the lighthouse keeper live?", max_tokens=16)
    with serve(changed(backend_settings, llm_url=forced.url)) as url:
        upload(url, LIGHTHOUSE)
        events = chat_events(url, question)
    done = next(e.data for e in events if e.event == "done")
    assert "".join(e.data["text"] for e in events if e.event == "token") == UNSURE_ANSWER.format(names="lighthouse.txt")
    assert done["unsure"] is True and done["likelihood"] < 0.08 and done["retried"] is False
    assert next(e.data for e in events if e.event == "citations")["citations"] == []
    with serve(backend_settings) as url:  # the model's own answer
        upload(url, LIGHTHOUSE)
        events = chat_events(url, question)
    done = next(e.data for e in events if e.event == "done")
    assert "Skerry" in "".join(e.data["text"] for e in events if e.event == "token")
    assert done["unsure"] is False and done["likelihood"] >= 0.08


@pytest.mark.parametrize("text", ["1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "3、4、5、6", "1 2 3 4"])
def test_a_line_of_numbers_counted_up_only_counts(text: str):
    assert counts_up(text)


@pytest.mark.parametrize("text", ["1, 2, 3", "6", "1, 3, 5, 7", "fields 1, 2, 3, 4", "1970 00:00 UTC"])
def test_a_number_or_a_few_or_numbers_among_words_are_answers(text: str):
    assert not counts_up(text)
