"""An extractive answer is a span of its sources: checked after the line, and forced on a retry when not.

The bundled base model, asked for "the shortest exact phrase" of its context, writes free text about a
quarter of the time (28 of 100 SQuAD answers were in no paragraph of the set, F1 0.13 on those), and
now and then a number that is not there ("8080" for the socks line of /etc/services, which holds 1080).
An answer line that is not a span of the prompt's sources (words compared case-folded, punctuation
ignored) is asked once more under `span_grammar`: a llama-server grammar whose every sentence is a run
of consecutive words of one source, so the model picks its likeliest span and numbers and codes come out
as the source writes them. Linear in the sources' length: one rule per word, each word followed by the
next one's rule or the end of the line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rag.core.cjk import CJK_CHARS, has_cjk

_WORD = re.compile(r"\w+", re.UNICODE)  # "asn1_der_decoding" is one word: "der_decoding" is no span of it
_SOURCE_LINE = re.compile(r"^\[S\d+\] (.*)$", re.M)
# A piece of a source: a CJK character (Chinese has no spaces: a span may start at any character), a word
# (inner dots, slashes, hyphens and colons kept: "993/tcp", "X.680"), or one other character.
_CJK = f"{CJK_CHARS}\\u3000-\\u303f\\uff00-\\uffef"
_PIECE = re.compile(f"[{_CJK}]|(?:[^\\W_{CJK_CHARS}]|_)+(?:[./:-](?:[^\\W_{CJK_CHARS}]|_)+)*|[^\\s{_CJK}]")


# A span ends at a field separator ("Default: 6; Meaning: ..." is cells, "1080/tcp # socks" a comment) and
# at a sentence end: a span running on through them was the retry's usual fault.
_BOUNDARY = frozenset(";#|。；！？")


def _ends_span(source: str, piece: re.Match[str], following: re.Match[str]) -> bool:
    """Whether no span goes on from `piece` to `following`: a boundary between them, or a sentence end."""
    if piece.group() in _BOUNDARY or following.group() in _BOUNDARY:
        return True
    return piece.group() in ".!?" and piece.end() < following.start()


def source_lines(prompt: str, examples: str) -> list[str]:
    """The sources of a completion prompt (rag.answering.prompt.CompletionStyle), without their ids."""
    return _SOURCE_LINE.findall(prompt.removeprefix(examples))


def _words(text: str) -> str:
    return " ".join(_WORD.findall(text.casefold()))


def is_span(answer: str, sources: Sequence[str]) -> bool:
    """Whether the answer's words stand together, in order, in one of the sources."""
    words = _words(answer)
    if not words:
        return False
    if has_cjk(words):
        return any(words in _words(s) for s in sources)
    return any(f" {words} " in f" {_words(s)} " for s in sources)


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def span_grammar(sources: Sequence[str]) -> str:
    """A GBNF grammar: an optional blank, then consecutive pieces of one source, then an optional newline."""
    rules: list[str] = []
    starts: list[str] = []
    for s, source in enumerate(sources):
        matches = list(_PIECE.finditer(source))
        for i, match in enumerate(matches):
            name = f"s{s}w{i}"
            if match.group() in _BOUNDARY:
                continue  # no span holds one, so no rule
            if _WORD.search(match.group()):  # a span starts at a word, not at punctuation
                starts.append(name)
            if i + 1 < len(matches) and not _ends_span(source, match, matches[i + 1]):
                gap = source[match.end() : matches[i + 1].start()]
                joint = _literal(" ") + " " if gap else ""
                rules.append(f"{name} ::= {_literal(match.group())} ({joint}s{s}w{i + 1})?")
            else:
                rules.append(f"{name} ::= {_literal(match.group())}")
    if not starts:
        return 'root ::= [^\\n]+ "\\n"?'
    return "\n".join([f'root ::= " "? ({" | ".join(starts)}) "\\n"?', *rules])
