"""An answer line that starts repeating itself ends where the repeat begins; the repeat never reaches the reader."""

from __future__ import annotations

import time

import httpx
import pytest

from rag.answering.repetition import LoopGuard
from rag.core.config import Settings
from tests.chat_helpers import ask, changed, parse_sse, serve, upload


def _shown(pieces: list[str]) -> tuple[list[str], bool]:
    guard = LoopGuard()
    shown = [guard.feed(piece) for piece in pieces]
    return [*shown, guard.rest()], guard.looped


def test_a_clause_said_again_and_again_is_cut_after_its_first_time():
    shown, looped = _shown(list("短叶水蜈蚣有毒性，有毒性，有毒性，有毒性，有毒性"))
    assert "".join(shown) == "短叶水蜈蚣有毒性" and looped


def test_a_span_then_its_repeat_keeps_the_span():
    shown, looped = _shown(list("他是土生土长的大埔人，他也是土生土长的大埔人，他也是"))
    assert "".join(shown).startswith("他是土生土长的大埔人") and looped
    assert "土生土长的大埔人" not in "".join(shown)[len("他是土生土长的大埔人") :]


def test_english_words_repeated_are_cut_and_case_does_not_hide_them():
    line = "trains across the river Lune until 1962, Trains across the River lune until 1962"
    shown, looped = _shown([f" {word}" for word in line.split()])
    assert "".join(shown) == " trains across the river Lune until 1962" and looped


@pytest.mark.parametrize(
    "line",
    [
        "Ilse Varga",
        "1887",
        "the Department of Energy and the Department of Defense",  # five words in common, not six
        "北京大学和清华大学",
        "[a](http://127.0.0.1:8000/a.png?d=1) and [b](http://127.0.0.1:8000/login?d=1)",  # one host, two links
        "",
    ],
)
def test_an_answer_that_does_not_loop_is_shown_whole(line: str):
    pieces = [line[i : i + 3] for i in range(0, len(line), 3)]
    shown, looped = _shown(pieces)
    assert "".join(shown) == line and not looped


@pytest.mark.parametrize("pieces", ["whole", "one character at a time"])
def test_a_number_that_grows_past_a_repeat_is_no_loop_however_it_is_streamed(pieces: str):
    line = "Line 1 runs from the airport to 1 Station Road; line 3 runs from the airport to 10 Main Street."
    shown, looped = _shown([line] if pieces == "whole" else list(line))
    assert "".join(shown) == line and not looped


def test_the_first_word_is_shown_at_once_and_at_most_seven_wait():
    guard = LoopGuard()
    assert guard.feed("Marta ") == "Marta "  # the first unit can never begin a repeat
    for word in ["Olsen ", "painted ", "the ", "chapel ", "ceiling ", "over ", "four "]:
        assert guard.feed(word) == ""  # any of these may still begin a run said again
    assert guard.feed("summers ").strip() == "Olsen"
    assert not guard.looped


def test_a_name_said_twice_in_a_chinese_span_is_no_loop():
    line = "四川大学华西医院是四川大学华西临床医学院的附属医院"
    shown, looped = _shown(list(line))
    assert "".join(shown) == line and not looped


LIGHTHOUSE = {"lighthouse.txt": "The lighthouse keeper lives on Skerry Island. She lights the lamp at dusk.\n"}
# The real model, held by a grammar to a line that repeats its clause for ever.
LOOP = 'root ::= "The keeper lives on Skerry Island" more\nmore ::= ", she lives on Skerry Island" more'


@pytest.mark.integration
def test_a_looping_answer_ends_where_it_starts_to_repeat_and_the_model_stops(
    forced_llama_server, backend_settings: Settings
):
    forced = forced_llama_server(grammar=LOOP)
    # Spans off: the forced line is no span of the source ("The keeper"), and a retry would answer another.
    with serve(changed(backend_settings, llm_url=forced.url, completion_spans="off")) as url:
        upload(url, LIGHTHOUSE)
        body = {**ask("Where does the keeper live?", max_tokens=200), "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat", json=body, timeout=300) as response:
            events = list(parse_sse(response.iter_lines()))
        tokens = "".join(e.data["text"] for e in events if e.event == "token")
        done = next(e.data for e in events if e.event == "done")
        # llama-server stops the slot when it sees the stream closed: within moments, not 200 tokens later.
        stopped_by = time.monotonic() + 2.0
        while _busy(forced.url) and time.monotonic() < stopped_by:
            time.sleep(0.05)
        assert not _busy(forced.url), "generation was stopped"
    assert tokens == "The keeper lives on Skerry Island"
    assert done["finish_reason"] == "repetition" and done["usage"]["completion_tokens"] < 50
    assert done["usage"]["prompt_tokens"] > 0


def _busy(llama_url: str) -> bool:
    return any(slot["is_processing"] for slot in httpx.get(f"{llama_url}/slots", timeout=10).json())


@pytest.mark.integration
def test_with_the_guard_off_the_loop_runs_to_the_token_limit(forced_llama_server, backend_settings: Settings):
    forced = forced_llama_server(grammar=LOOP)
    with serve(
        changed(backend_settings, llm_url=forced.url, completion_stop_loops=False, completion_spans="off")
    ) as url:
        upload(url, LIGHTHOUSE)
        answer = httpx.post(
            f"{url}/v1/chat", json=ask("Where does the keeper live?", stream=False, max_tokens=64), timeout=300
        ).json()
    assert answer["answer"].count("she lives on Skerry Island") > 3
    assert answer["done"]["finish_reason"] == "length" and answer["done"]["usage"]["completion_tokens"] == 64
