"""How many: a count a source's sentence states of what the question counts, read without the model.

"How many fields does each line of /etc/passwd have?" over "Each line of /etc/passwd has seven fields
separated by colons" is answered "seven": the sentence counts the question's noun ("fields", its stem) with
one number, as digits or a word from one to twenty, holds half of the question's other words at least and
every path the question names.
The bundled base model read that chunk and wrote "5" (a field number of the table below it). Only when
exactly one count answers, over the sentences of the first source: a sentence with two counts of the noun
("two or three fields") or two sentences with different counts leave it to the model.
"""

from __future__ import annotations

import re

from rag.answering.focus import terms

NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty"
).split()
_HOW_MANY = re.compile(r"\bhow many ([a-z]+)", re.I)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_COUNT = rf"(\d{{1,3}}(?:,\d{{3}})+|\d+|{'|'.join(NUMBER_WORDS)})"  # 2,000 is one number
_PATH = re.compile(r"(?:/[\w.-]+)+")  # /etc/shadow: a sentence about /etc/passwd counts another file's fields
_ALTERNATIVE = re.compile(rf"(?<![\w.-]){_COUNT}\s+(?:or|to|and)\s+$", re.I)
MIN_SHARE = 0.5  # of the question's other words, the sentence holds this share at least


def stated_count(text: str, question: str) -> str | None:
    """The count, as the source writes it, that `text` states of what `question` asks how many of; None
    when the question asks no count or not exactly one count in the text answers it."""
    asked = _HOW_MANY.search(question)
    if asked is None:
        return None
    noun = asked.group(1).casefold()
    stem = noun[:-1] if noun.endswith("s") and len(noun) > 3 else noun
    counted = re.compile(rf"(?<![\w.,-]){_COUNT}(?:\s+[a-z-]+)?\s+{re.escape(stem)}\w*", re.I)
    others = terms(question[: asked.start()] + question[asked.end() :]) - terms("how many")
    paths = set(_PATH.findall(question))
    found: set[str] = set()
    for sentence in _SENTENCE.split(text):
        matches = list(counted.finditer(sentence))
        if not matches:
            continue
        if len({m.group(1) for m in matches}) > 1 or any(_ALTERNATIVE.search(sentence[: m.start()]) for m in matches):
            return None  # "4 fields, or 5 fields with…", "two or three fields"
        if others and len(others & terms(sentence)) < MIN_SHARE * len(others):
            continue
        if any(path not in sentence for path in paths):
            continue
        found |= {m.group(1) for m in matches}
    return found.pop() if len(found) == 1 else None
