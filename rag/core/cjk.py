"""What counts as a CJK character, for every part that treats Chinese, Japanese and Korean text apart
(the lexical tokenizer, OCR line joining, the loop guard, citation support, the evaluation's metrics).

    is_cjk("東")                          # True
    re.compile(f"[{CJK_CHARS}]+")         # a run of them, inside a regex character class

The ideographs (the unified block, extension A and the compatibility ideographs), the kana and the
Hangul syllables: the characters that stand for a syllable or a word and are written without spaces
between words. Punctuation and symbols (full-width commas, CJK brackets) are not letters and do not count,
as Latin punctuation does not: a share of CJK characters is a share of letters.
"""

from __future__ import annotations

import re

CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"  # a regex character class's ranges
_ONE = re.compile(f"[{CJK_CHARS}]")


def is_cjk(char: str) -> bool:
    """Whether `char` (one character; False for "") is a CJK character."""
    return _ONE.fullmatch(char) is not None


def has_cjk(text: str) -> bool:
    """Whether `text` holds a CJK character anywhere."""
    return _ONE.search(text) is not None


_RUN = re.compile(f"[{CJK_CHARS}]+")


def cjk_runs(text: str) -> list[str]:
    """The text's runs of CJK characters, in order ("ls 的 -t 选项" -> ["的", "选项"])."""
    return _RUN.findall(text)
