"""What became of a client's system message is read from the prompt's budget, and shown where sources show."""

from __future__ import annotations

from rag.answering.events import Budget, Collected
from rag.api.citation_links import SYSTEM_NOTES, url_citations
from rag.api.routes.openai_compat import system_message


def answered(**budget: object) -> Collected:
    collected = Collected()
    collected.absorb(Budget(**budget))  # type: ignore[arg-type]
    return collected


def test_a_system_message_in_the_prompt_is_passed_or_cut():
    assert system_message(answered(n_ctx=4096, client_system=12), sent=1) == "passed"
    assert system_message(answered(n_ctx=4096, client_system=256, client_system_cut=True), sent=1) == "cut"


def test_a_system_message_left_out_says_why():
    assert system_message(answered(n_ctx=4096, style="completion"), sent=1) == "base_model"
    assert system_message(answered(n_ctx=4096, style="chat", client_system_cut=True), sent=2) == "too_long"
    assert system_message(answered(), sent=1) == "none", "no prompt was built: nothing generated to note"
    assert system_message(answered(n_ctx=4096), sent=0) == "none"


def test_each_outcome_but_passed_is_one_note_among_the_annotations():
    def notes(system: str) -> list[str]:
        found = url_citations("An answer.", [], None, base_url="http://api/", collection=None, system=system)  # type: ignore[arg-type]
        return [a.url_citation.title for a in found]

    assert notes("passed") == [] and notes("none") == []
    for outcome in ("cut", "too_long", "base_model"):
        assert notes(outcome) == [SYSTEM_NOTES[outcome]]  # type: ignore[index]
