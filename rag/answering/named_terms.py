"""The names a question asks about, and which of them no document holds.

A question about something the documents never mention ("Which port does MongoDB use by default?" over
Debian's documentation) still finds chunks that look near: other ports, other databases. Its own name is
the plainest sign: when the index holds no word of "MongoDB" at all, no chunk can answer it, however near
the rest of the question comes. `names` picks the words a question names things with:

- a word with a capital after its first letter or with a digit: MongoDB, OpenSSL, HTTP/2, ext4, SHA-256;
- a word starting with a capital inside a sentence (not its first word): Elasticsearch, Docker, Python;
- in a question written in Chinese (or another CJK script), every word of another script: nginx, git
  rebase, Rust.

A word of one letter is never a name ("What does -x do?"), nor a number alone (years and versions turn
up everywhere). rag.answering.retrieval looks each name's search terms up in the lexical index: a name
none of whose terms any chunk of the searched documents holds is unknown, and rag.answering.coverage_rule
then asks the refusal model for its higher `named_threshold`; a refusal's fixed answer says what no
document mentions (RAG_REFUSE_UNKNOWN_NAMES).

Measured on bench/real_docs (Debian's documents, 22 questions no document covers, 173 that one does):
14 of the 22 name something the index never holds, none of the 173 does (bench/README.md, "Names the
documents never mention").
"""

from __future__ import annotations

import re

from rag.core.cjk import CJK_CHARS, has_cjk

# A word of letters (of any script but the CJK ones, whose text has no words) and digits, its parts joined
# by . _ + / - ("Node.js", "HTTP/2", "SHA-256", "ERR_HTTP2_ALTSVC", "Jerónimo"), starting with a letter;
# not the tail of a word or number ("6.6p1" is no name "p1").
_LETTER = f"[^\\W\\d_{CJK_CHARS}]"
_PART = f"(?:{_LETTER}|\\d)"
_WORD = re.compile(f"(?<!{_PART})(?<![._+/-]){_LETTER}{_PART}*(?:[._+/-]{_PART}+)*")
_SENTENCE_END = re.compile(r"[.!?:;。！？：；]\s*$")


def names(question: str) -> list[str]:
    """The words of `question` that name something (see the module docstring), in their order, once each."""
    found: list[str] = []
    cjk = has_cjk(question)
    for match in _WORD.finditer(question):
        word = match.group()
        if len(word) < 2 or word in found:
            continue
        before = question[: match.start()]
        opens_sentence = not before.strip() or bool(_SENTENCE_END.search(before))
        marked = any(c.isupper() for c in word[1:]) or any(c.isdigit() for c in word)
        if cjk or marked or (word[0].isupper() and not opens_sentence):
            found.append(word)
    return found
