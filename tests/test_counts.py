"""How many: the count a source's sentence states of what the question counts (rag.answering.counts), read
without the model; pure text logic."""

from __future__ import annotations

import pytest

from rag.answering.counts import stated_count

PASSWD = (
    "The fields of /etc/passwd\n\nEach line of /etc/passwd has seven fields separated by colons, from passwd(5).\n"
    "| Field | Name |\n| --- | --- |\n| 5 | GECOS |"
)


def test_the_count_of_the_noun_asked_is_read_as_the_source_writes_it():
    assert stated_count(PASSWD, "How many fields does each line of /etc/passwd have?") == "seven"
    assert (
        stated_count(
            "Warsaw University of Technology employs 2,000 professors.",
            "How many professors does the Warsaw University of Technology employ?",
        )
        == "2,000"
    )


@pytest.mark.parametrize(
    ("text", "question"),
    [
        (PASSWD, "How many fields does each line of /etc/shadow have?"),  # another file's fields
        (PASSWD, "How many users does /etc/passwd list?"),  # it counts no users
        ("Each line has two or three fields.", "How many fields does each line have?"),
        ("A line has 4 fields. A header line has 5 fields.", "How many fields does a line have?"),
        ("The river is 40 metres wide.", "When was the bridge over the river built?"),  # no count asked
    ],
)
def test_no_count_is_read_where_none_or_more_than_one_answers(text: str, question: str):
    assert stated_count(text, question) is None
