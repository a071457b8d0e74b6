"""Never a blank answer: text with nothing usable in it is held back, retried once, then said in words.

A generator can end its answer before writing anything: the bundled base model, in the completion
style, sometimes finds a newline likelier than any word after "Answer:" (5.2% against 4.6% for " DER"
on "Which function decodes DER data?" over the libtasn1 manual), and the newline stop ends the reply
at its first token. Without that stop the model goes on with a new "Question:" line, so dropping the
stop (or a leading newline) gives no answer either. What works is the retry with `ANSWER_LINE_GRAMMAR`:
a llama-server grammar that lets the line end only after a letter or digit, so the model writes its
best non-blank answer. It runs only when the first attempt gave nothing usable (a grammar slows each
token about 2.5 times here, and almost every answer needs none).

An answer that only repeats its question (all of it, or a number of it: "1" to a question about ASN.1)
is retried once too, its first token forbidden (rag.answering.answer_stream holds the completion style's whole
line to judge it); so is a line that only counts ("1, 2, 3, 4, 5, …", `counts_up`), and one that still
counts after the retry becomes `no_answer_text`.

A reply still without a letter or digit (empty, whitespace, punctuation alone) becomes `no_answer_text`,
which says so and points at the sources; the `done` event then carries `no_answer: true`.

A line the model did write but gave a likelihood below the generator's floor (the geometric mean of its
tokens' probabilities, `done.likelihood`) is withheld the same way: `unsure_text` says the sources do not
answer clearly and names them, and `done` carries `unsure: true`. With the bundled base model every line
below 0.08 on the real-documents benchmark and on the SQuAD slice was wrong, and three of the four answers
to questions the documents do not cover were there (bench/README.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rag.core.cjk import has_cjk

_USABLE = re.compile(r"[^\W_]")  # a letter or a digit, of any script

NO_ANSWER = "The model gave no answer; see the sources ({names})."
COUNTED = 4  # numbers counted up one by one, at least, make a line that only counts
# A line the model wrote with too low a likelihood (Settings.completion_likelihood_floor): withheld.
UNSURE_ANSWER = "The sources do not say this clearly enough for an answer; see them ({names})."
UNSURE_ANSWER_ZH = "来源中没有找到足够明确的答案；请查看来源（{names}）。"

# Blanks and ASCII punctuation may lead; the line ends only after one other character (a letter, a
# digit, any non-ASCII character), at the newline that the completion style's stop catches.
_JUNK = r""" \t\r.,;:!?"'()\[\]{}<>*#_~`@$%^&+=/\\|-"""
ANSWER_LINE_GRAMMAR = f'root ::= junk* good [^\\n]* "\\n"?\njunk ::= [{_JUNK}]\ngood ::= [^\\n{_JUNK}]'


def unsure_text(source_names: Iterable[str], chinese: bool) -> str:
    """The answer's text when the model's own line was too unlikely to show: it says so and names the
    sources to read instead."""
    return (UNSURE_ANSWER_ZH if chinese else UNSURE_ANSWER).format(names=_listed(source_names))


def usable(text: str) -> bool:
    """Whether `text` holds an answer at all: a letter or a digit somewhere."""
    return _USABLE.search(text) is not None


def _words(text: str) -> str:
    return " ".join(re.findall(r"[^\W_]+", text.casefold()))


def counts_up(text: str) -> bool:
    """Whether the line only counts ("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"): COUNTED numbers or more, each one more
    than the one before, and nothing else but separators. The base model writes it for a question that asks
    which field or how many, in Chinese most; it holds the number asked for and answers nothing."""
    numbers = re.findall(r"\d+", text)
    if len(numbers) < COUNTED or re.sub(r"[\d\s,，、;；.]+", "", text):
        return False
    values = [int(n) for n in numbers]
    return all(b == a + 1 for a, b in zip(values, values[1:]))


def echoes(text: str, question: str) -> bool:
    """Whether an extractive answer only repeats its question: all of it, most of it, or one number or
    character of it ("1" for "Which recommendation specifies ASN.1?"). A short piece ("Paris" for "Paris
    or Rome?") is no echo: a choice question is answered with one of its own words; nor is a letter that is
    no word of the question ("-m" to "Which option creates the home directory?")."""
    words, asked = _words(text), _words(question)
    # Whole words of the question ("m" is in "home" but no echo of it); Chinese, written without spaces, as text.
    if not words or (words not in asked if has_cjk(words) else f" {words} " not in f" {asked} "):
        return False
    bare = len(words) == 1 or words.isdigit()
    return bare or len(words) >= 0.5 * len(asked)


def no_answer_text(source_names: Iterable[str]) -> str:
    """The answer's text when the model gave none: it says so and names the sources to read instead."""
    return NO_ANSWER.format(names=_listed(source_names))


def _listed(source_names: Iterable[str]) -> str:
    """The sources' names, each once, in order ("none" for none)."""
    return ", ".join(dict.fromkeys(n for n in source_names if n)) or "none"
