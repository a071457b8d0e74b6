"""The lexical tokenizer: character bigrams for CJK runs, lower-cased words for the rest, English stop
words dropped and ASCII words Snowball-stemmed."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag.core.cjk import CJK_CHARS, is_cjk
from rag.core.stemming import stems

_TOKEN = re.compile(rf"[{CJK_CHARS}]+|[^\W_{CJK_CHARS}]+", re.UNICODE)

# Lucene's English stop words, question words and the one-letter leftovers of contractions ("don't").
# BM25 weighs them near zero anyway; dropping them keeps OR queries off the longest posting lists.
STOPWORDS_EN = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with what which who whom whose when where why how do does did has have had were "
    "been being s t".split()
)


def cjk_fraction(text: str) -> float:
    """The share of CJK characters among the letters and digits of `text`."""
    letters = sum(len(m.group()) for m in _TOKEN.finditer(text))
    return sum(1 for ch in text if is_cjk(ch)) / letters if letters else 0.0


@dataclass(frozen=True)
class Tokenizer:
    """Words for alphabetic scripts (optionally stop-worded and stemmed), character bigrams for CJK."""

    stem: bool = True
    stopwords: bool = True

    @property
    def name(self) -> str:
        return "cjk2+words" + ("+stop" if self.stopwords else "") + ("+stem" if self.stem else "")

    def __call__(self, text: str) -> list[str]:
        tokens: list[str] = []
        words: list[str] = []
        for match in _TOKEN.finditer(text.lower()):
            run = match.group()
            if is_cjk(run[0]):
                tokens.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
            elif not (self.stopwords and run in STOPWORDS_EN):
                (words if self.stem and run.isascii() else tokens).append(run)
        if words:
            tokens.extend(stems(words))
        return tokens


lexical_tokens = Tokenizer()
