"""Definition lists: a term on a line of its own and its meaning indented below it (or after a run of spaces),
as man pages list their options and exit values,

    -k --keep
           Keep (don't delete) input files during compression or decompression.
    -t     按时间排序，最新的最前；参见 --time

a PDF's text its one-word terms over their meanings ("noauto" / "do not mount when mount -a is given"), a
README its commands each with a dash and its meaning ("pg_upgradecluster - Migrate a cluster from one major
version to another one."), and an OCR its options run together ("-s, --symbolic-link使用符号链接代替复制-S,
--suffix=…").

A small base model asked which option keeps the input files reads such a chunk and takes a neighbouring
entry's term ("-l --list"), and asked what `-t` does, another entry's words: 22 of the 93 wrong answers of
bench/real_docs before this module were such questions. So a question that names one entry ("What does
exit value 9 of useradd mean?", "ls 的 -t 选项做什么？", "What is the disk group for?") is answered by its
meaning, and one that asks which option, exit value or command does something ("Which gzip option checks
the compressed file integrity?") by the term of the one entry whose meaning holds the most of the
question's words, weighted by how few entries hold each; both read, not generated, and only when exactly
one entry answers.

Terms are compared as written (`-s` is not `-S`); words as `focus.terms` compares them, less a plural's
`s`; Chinese by its character pairs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from rag.answering.focus import terms
from rag.core.cjk import CJK_CHARS, cjk_runs, has_cjk

MIN_ENTRIES = 3  # fewer entries keyed by words are no list (a short line over an indented example looks like one)
MAX_TERM_WORDS = 6
_INDENT = re.compile(r"^(?: {2,}|\t)\S")
_INLINE = re.compile(r"^([-+]\S*(?:,? [-+]\S*)*|\d+)(?: {2,}|\t)(\S.*)$")  # "-t     按时间排序", "2  error"
_ONE_WORD = re.compile(r"^[A-Za-z_][\w-]*$")
_DASHED = re.compile(r"^(\s*)([A-Za-z_][\w.-]*)\s+-\s+(\S.*)$")  # "   pg_dropcluster    - Completely remove a cluster."
_RUN_TERM = re.compile(
    rf"(?<![A-Za-z0-9])(?:(?:-[A-Za-z0-9],\s*)*--[a-z][A-Za-z0-9_-]*(?:\[=[^\]]*\]|=[^{CJK_CHARS}\s，。]*)?|-[A-Za-z0-9] )"
    rf"(?=[{CJK_CHARS}]|\s*$)"  # or at the end: a term whose meaning the next page holds
)
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)")
_NUMBER = re.compile(r"(?<![\w.-])(\d+)(?![\w.])")
_ASKS_WHICH = re.compile(
    r"\bwhich\b|\bwhat\s+(?:option|flag|switch|exit|value|status|code|number)s?\b|哪个|哪些|哪一个|什么选项", re.I
)
_WHICH_OF_ANOTHER = re.compile(r"\b(?:in|on|at|by|for|from|with|to) which\b", re.I)  # "In which format…"
_LIST_NOUN = re.compile(
    r"\b(?:options?|flags?|switch(?:es)?|exit|values?|status|codes?|commands?|tools?)\b|选项|参数|退出", re.I
)
_COMMAND_NOUN = re.compile(r"\b(?:commands?|tools?)\b", re.I)
_NUMBER_NOUN = re.compile(r"\b(?:exit|return|values?|status|codes?)\b|退出|返回", re.I)
# Words that ask, not say what is asked: the list's nouns, "which", and Chinese pairs holding 哪/个/选/项/的/用
_ASKING = re.compile(r"^(?:optio|flag|switc|exit|value|statu|code|retur|which|give|comman|tool)|[哪个选项的用么]")
_IDENTIFIER = re.compile(r"^(?=\w*(?:_|\d|[A-Z]{4}))[A-Za-z_]\w*$")  # BZ_OK, SIGTERM, x11; not "user"
_CALLED = r"(?:option|flag|setting|constant|keyword|group|user)s?\b"
_EXIT_NOUN = re.compile(r"\b(?:exit|return)\b|退出|返回", re.I)
_SENTENCE_END = re.compile(r"(?<=[.;])\s+(?=[A-Z(])|(?<=[。；])")  # not inside "(e.g., at boot time)"
MIN_SCORE = 1.0  # the best entry's meaning holds at least one of the question's words no other entry holds
MIN_SHARE = 0.5  # ...and half of its words (or Chinese character pairs) at least
MARGIN = 1.5  # ...and more of them than the next best, by this much
SHORT_WORDS = 3  # a sentence of fewer Latin words and Chinese characters ("Test.") comes with the next one


@dataclass(frozen=True)
class Entry:
    """One entry of a definition list: its term line, the names it gives (`-T`, `--tabsize`), its meaning."""

    term: str
    names: frozenset[str]
    meaning: str
    command: bool = False  # a command of a dashed list ("pg_lsclusters - Show…"), what "which command" asks for


def entries(text: str, fewest: int = MIN_ENTRIES) -> list[Entry]:
    """The definition list entries of a chunk's text, in order; under `fewest`, only those keyed by an
    option or a number (a chunk of a man page with long meanings holds one or two)."""
    found = _dashed(text) or _indented(text) or _flush(text) or _run_together(text)
    return found if len(found) >= fewest else [e for e in found if _is_key(e.term)]


def _indented(text: str) -> list[Entry]:
    """Entries whose meaning is indented under the term, or follows it after a run of spaces (man pages)."""
    found: list[Entry] = []
    term: str | None = None
    meaning: list[str] = []

    def close() -> None:
        if term is not None and meaning:
            found.append(Entry(term, _names(term), " ".join(meaning)))

    for line in text.splitlines():
        if not line.strip():
            continue
        if _INDENT.match(line):
            if term is not None:
                meaning.append(line.strip())
            continue
        close()
        term, meaning = None, []
        inline = _INLINE.match(line.rstrip())
        if inline:
            term, meaning = inline.group(1), [inline.group(2).strip()]
        elif len(line.split()) <= MAX_TERM_WORDS and not line.rstrip().endswith((".", ":", "。", "：")):
            term = line.strip()
    close()
    return found


def _dashed(text: str) -> list[Entry]:
    """Entries of a list of commands, each a word, a spaced dash and its meaning, which goes on over the lines
    indented deeper ("   pg_createcluster  - Create a new cluster or integrate an existing one into" /
    "                       the postgresql-common architecture."); MIN_ENTRIES of them at least."""
    found: list[Entry] = []
    indent: int | None = None
    for line in text.splitlines():
        dashed = _DASHED.match(line)
        if dashed and (indent is None or len(dashed.group(1)) == indent):
            indent = len(dashed.group(1))
            term = dashed.group(2)
            found.append(Entry(term, frozenset({term}), dashed.group(3).strip(), command=True))
        elif found and indent is not None and line.strip() and len(line) - len(line.lstrip()) > indent:
            last = found.pop()
            found.append(Entry(last.term, last.names, f"{last.meaning} {line.strip()}", command=True))
        elif found and line.strip():
            break  # the list ended: prose below it is no meaning
    return found if len(found) >= MIN_ENTRIES else []


def _flush(text: str) -> list[Entry]:
    """Entries whose term is one word on a line of its own, its meaning on the lines below, none indented
    (a PDF's text: "noauto" / "do not mount when mount -a is given", "BZ_DATA_ERROR_MAGIC" / "if the ...")."""
    found: list[Entry] = []
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if _ONE_WORD.match(line)]
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(lines)
        if end > start + 1:
            found.append(Entry(lines[start], _names(lines[start]), " ".join(lines[start + 1 : end])))
    return found


def _run_together(text: str) -> list[Entry]:
    """Entries of Chinese text whose lines an OCR joined into one run ("-s, --symbolic-link使用符号链接代替
    复制-S,--suffix=后缀名使用…"): a term is options (a long one, or a short one and a space) right before
    a Chinese character, not right after a Latin letter ("-dR--preserve=all") nor inside an open bracket
    ("(和--force行为相反)"); a meaning of one character is the start of the one before ("-p 与--preserve=…
    相同")."""
    if not has_cjk(text):
        return []
    found: list[Entry] = []
    starts = [m for m in _RUN_TERM.finditer(text) if not _open_bracket(text[: m.start()])]
    for m, after in zip(starts, [*starts[1:], None], strict=False):
        meaning = text[m.end() : after.start() if after else len(text)].strip()
        if found and len(found[-1].meaning) < 2:
            last = found.pop()
            meaning = f"{last.meaning}{m.group(0)}{meaning}"
            found.append(Entry(last.term, last.names, meaning))
        elif meaning:
            term = m.group(0).strip()
            found.append(Entry(term, _names(term), meaning))
    # Prose naming an option or two ("使用 -l 时显示…") is no list: a list names long options, and many.
    return found if sum(1 for e in found if "--" in e.term) >= 2 else []


def _open_bracket(before: str) -> bool:
    """Whether the text before ends inside a bracket opened within its last 40 characters."""
    tail = before[-40:]
    return max(tail.rfind("("), tail.rfind("（")) > max(tail.rfind(")"), tail.rfind("）"))


def _names(term: str) -> frozenset[str]:
    """What a term line names: its options without their argument ("--tabsize=列数" names "--tabsize"), a
    number, or its words."""
    options = _OPTION.findall(term)
    if options:
        return frozenset(options)
    return frozenset(w.strip(",") for w in term.split() if w.strip(","))


def named(question: str, entry: Entry) -> bool:
    """Whether the question names the entry: one of its options as written, its number when it asks about
    an exit or return value, an identifier ("BZ_DATA_ERROR_MAGIC"), a word it calls an option, a group or a
    user ("the noauto mount option", "the disk group"), or, in Chinese, the whole term ("密码警告时间段"). A
    word alone is no name: a FILES list
    keyed "/etc/shadow" is not what "In /etc/shadow, what does an empty field mean?" asks about."""
    if entry.names & set(_OPTION.findall(question)):
        return True
    if entry.term.isdigit():
        return _EXIT_NOUN.search(question) is not None and entry.term in _NUMBER.findall(question)
    if has_cjk(entry.term):
        return entry.term in question
    if not _ONE_WORD.match(entry.term):
        return False
    word = re.escape(entry.term)
    if _IDENTIFIER.match(entry.term):
        return re.search(rf"(?<![\w-]){word}(?![\w-])", question) is not None
    return re.search(rf"(?<![\w-]){word}(?: \w+)? {_CALLED}|{_CALLED} {word}(?![\w-])", question, re.I) is not None


def _is_key(term: str) -> bool:
    """A term of options or a number: what a list of options or exit values is keyed by."""
    return bool(_OPTION.match(term)) or term.isdigit()


def named_documents(question: str, sources: Iterable[str]) -> set[str]:
    """The sources whose file name starts with a word the question says: a man page's command ("cp 的 -x
    选项做什么？" names cp.1.gz, and ls.1.gz's -x is not what it asks about)."""
    said = {w.casefold() for w in re.findall(r"[^\W_]+", question)}
    return {s for s in sources if re.split(r"[._-]", PurePosixPath(s).name, maxsplit=1)[0].casefold() in said}


def named_option(question: str) -> str | None:
    """The option the question names, when it names one (not "the flag -9 without -s")."""
    options = set(_OPTION.findall(question))
    return options.pop() if len(options) == 1 else None


def asks_for_entry(question: str) -> bool:
    """Whether the question names one option, or asks which option or exit value does something."""
    return named_option(question) is not None or _asks_which(question)


def first_answering(texts: Sequence[str], question: str) -> int | None:
    """The index of the first text whose definition list holds the one option the question names, or, for
    a question asking which option or exit value does something, the entry all the texts' lists together
    answer it with (weighed over all of them: one chunk of a man page holds a few entries alike)."""
    option = named_option(question)
    if option is not None:
        return next((i for i, text in enumerate(texts) if any(option in e.names for e in entries(text))), None)
    if not _asks_which(question):
        return None
    first: dict[str, tuple[int, Entry]] = {}
    for i, text in enumerate(texts):
        for entry in entries(text):
            first.setdefault(entry.term, (i, entry))  # chunks overlap: an entry counts once
    term = _which([e for _, e in first.values()], question)
    return first[term][0] if term is not None else None


def _asks_which(question: str) -> bool:
    return _ASKS_WHICH.search(question) is not None and _LIST_NOUN.search(question) is not None


def named_entry(text: str, question: str) -> str | None:
    """The answer a definition list in `text` gives to `question`: the meaning of the one entry it names,
    or, asked which entry does something, the term of the one entry whose meaning matches it best; None
    when the text holds no list or no one entry answers."""
    called = re.findall(_CALLED, question, re.I)  # "the disk group": a chunk's end may cut its list to two
    found = entries(text, fewest=2 if called else MIN_ENTRIES)
    if not found:
        return None
    if _asks_which(question):
        return _which(found, question)
    if _ASKS_WHICH.search(question) and not _WHICH_OF_ANOTHER.search(question):
        return None  # "Which command is identical to gunzip -c?" asks for a term, not -c's meaning
    if len(set(_OPTION.findall(question))) > 1:
        return None  # "the flag -9 without -s": a question about both, not what one of them means
    picked = {e.meaning: e for e in found if named(question, e)}
    if len(picked) != 1:
        return None
    entry = next(iter(picked.values()))
    return _sentence_asked(entry.meaning, _units(question) - _units(entry.term) - _units(" ".join(called)))


def _which(found: Sequence[Entry], question: str) -> str | None:
    """The term of the one entry of the kind asked (options, numbers for an exit value, commands of a dashed
    list) whose meaning holds the question's words best, weighted by how few entries hold each."""
    if _COMMAND_NOUN.search(question):
        keyed = [e for e in found if e.command]
    elif _NUMBER_NOUN.search(question):
        keyed = [e for e in found if e.term.isdigit()]
    else:  # "-# --fast --best" is options too, though "-#" is none that a question could name
        keyed = [e for e in found if e.term.startswith(("-", "+")) and _OPTION.search(e.term)]
    asked = {t for t in _units(question) if not _ASKING.search(t) and (len(t) > 2 or has_cjk(t))}
    units = [_units(e.meaning) & asked for e in keyed]
    weights = {t: 1.0 / n for t in asked if (n := sum(1 for u in units if t in u))}
    scores = sorted(((sum(weights[t] for t in u), len(u), i) for i, u in enumerate(units)), reverse=True)
    if not scores or scores[0][0] < MIN_SCORE or scores[0][1] < MIN_SHARE * len(asked):
        return None
    if len(scores) > 1 and scores[0][0] < MARGIN * scores[1][0]:
        return None
    return keyed[scores[0][2]].term


def _units(text: str) -> set[str]:
    """Words as compared (`focus.terms`, a plural's "s" off) and Chinese character pairs."""
    words = {t[:-1] if len(t) > 3 and t.endswith("s") else t for t in terms(text)}
    pairs = {run[i : i + 2] for run in cjk_runs(text) for i in range(len(run) - 1)}
    return words | pairs


def _short(sentence: str) -> bool:
    return len(re.findall(r"[^\W\d_]+", sentence)) < SHORT_WORDS and sum(map(len, cjk_runs(sentence))) < SHORT_WORDS


def _sentence_asked(meaning: str, asked: set[str]) -> str:
    """The meaning's sentence holding the most of the question's other words (the first on a tie), with the
    next one when it is short ("Test." then "Check the compressed file integrity.")."""
    sentences = [s.strip().rstrip(";；") for s in _SENTENCE_END.split(meaning) if s.strip(";； ")]
    scores = [len(_units(s) & asked) for s in sentences]
    first = scores.index(max(scores))
    answer = sentences[first]
    if _short(answer) and first + 1 < len(sentences):
        answer = f"{answer} {sentences[first + 1]}"
    return answer
