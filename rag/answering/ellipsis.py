"""Elliptical follow-ups made whole: "And pop3s?" after "Which port does the imaps service use?" is asked
as "Which port does the pop3s service use?".

A follow-up that names only a new subject ("And -M?", "What about EMFILE?", "那 -A 呢？") leaves the model
to guess the question; the bundled base model answers the previous one again ("993") or says "Yes". The
whole question is the previous one with the word the new subject stands for replaced. Which word: one of
the same form (an option `-x`, a word in capitals, a capitalized name, a word with digits), the most alike
by its letters and length; a plain new word (Latin letters) may stand for a plain word that is no
question word. A follow-up that repeats the previous question's words but for one new option, code in
capitals or word with digits ("And what does its -t option do?" after "What does gzip's -k option do?")
is that question with the new one in place of the old one of its form. A subject of several words, or a
previous question with no word of a fitting form, is left as asked (the follow-up rule in
`rag.answering.followup` still searches it with the previous question).

No model call; the rewritten question is what retrieval searches and what the prompt asks, so the user
sees it in the `sources` event.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from difflib import SequenceMatcher

from rag.answering.prompt import Message

_ENGLISH = re.compile(
    r"^\s*(?:and|also|and what about|and how about|what about|how about)\s+(?P<subject>[^\s?？]+)\s*[?？]?\s*$",
    re.IGNORECASE,
)
_CHINESE = re.compile(r"^\s*(?:那么?|还有)?\s*(?P<subject>[^\s?？]+?)\s*呢\s*[?？]?\s*$")
_LATIN = re.compile(r"[A-Za-z0-9_-]+")
_EDGE = "\"'“”‘’()[]{}<>,.;:!?？。，、"
_POINTERS = frozenset("also it its it's they them their this that these those one ones then".split())
# Words that frame a question rather than name its subject: never the word a new subject replaces.
_FRAME = frozenset(
    "a an the of in on at to for from by with about and or is are was were be been do does did doing can could "
    "should would will shall may might must has have had what which who whom whose when where why how".split()
)


def whole_question(history: Sequence[Message], question: str) -> str:
    """The follow-up as a whole question, when it names only a new subject; else the question unchanged."""
    previous = next((m["content"] for m in reversed(history) if m["role"] == "user" and m["content"].strip()), None)
    match = _ENGLISH.match(question) or _CHINESE.match(question)
    if previous is None:
        return question
    subject = match["subject"].strip(_EDGE) if match else _new_code(previous, question)
    if not subject:
        return question
    words = previous.split()
    index = _stands_for(subject, words)
    if index is None or (match is None and _form(subject) != _form(words[index].strip(_EDGE))):
        return question
    word = words[index]
    core = word.strip(_EDGE)
    words[index] = word.replace(core, subject, 1)
    return " ".join(words)


def _new_code(previous: str, question: str) -> str | None:
    """The one new option, capitalized code or word with digits of a follow-up that otherwise repeats the
    previous question's words ("And what does its -t option do?" after "What does gzip's -k option do?"),
    pronouns and question words aside; None for any other follow-up."""
    before = {_key(w.strip(_EDGE)) for w in previous.split()}
    new = [w for w in (w.strip(_EDGE) for w in question.split()) if w and _key(w) not in before]
    codes = [w for w in new if _form(w) in ("option", "capitals", "digits")]
    rest = {w.casefold() for w in new} - {c.casefold() for c in codes} - _FRAME - _POINTERS
    return codes[0] if len(codes) == 1 and not rest else None


def _key(word: str) -> str:
    """A word as follow-ups are compared: case-folded, but an option keeps its case (-m is not -M)."""
    return word if _form(word) == "option" else word.casefold()


def _form(word: str) -> str:
    if re.fullmatch(r"--?[\w-]+", word):
        return "option"
    if re.fullmatch(r"[A-Z][A-Z0-9_]+", word):
        return "capitals"
    if re.search(r"\d", word) and re.search(r"[^\W\d_]", word):
        return "digits"
    if re.fullmatch(r"[A-Z][a-z]+", word):
        return "name"
    return "plain"


def _stands_for(subject: str, words: list[str]) -> int | None:
    """The index of the word of the previous question that `subject` stands for, if one fits."""
    form = _form(subject)
    plain = form in ("plain", "digits")
    if plain and not _LATIN.fullmatch(subject):
        return None  # words of a script without spaces cannot be lined up word for word
    fits: list[tuple[float, int]] = []
    for i, word in enumerate(words):
        core = word.strip(_EDGE)
        if not core or core == subject or core.lower() in _FRAME or (i == 0 and _form(core) == "name"):
            continue
        if plain and not _LATIN.fullmatch(core):
            continue
        same = _form(core) == form
        if same or (plain and _form(core) in ("plain", "digits")):
            alike = SequenceMatcher(None, subject.lower(), core.lower()).ratio()
            length = min(len(subject), len(core)) / max(len(subject), len(core))
            fits.append((alike + length + (1.0 if same else 0.0), i))
    return max(fits)[1] if fits else None
