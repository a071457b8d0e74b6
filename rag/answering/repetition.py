"""Ending an answer line that has started to loop, before the loop reaches the reader.

A small base model asked for a span sometimes copies it and then repeats it, or a clause of it, until
the token limit ("短叶水蜈蚣有毒性，有毒性，有毒性，…"): on 200 CMRC questions 18.5% of the bundled
model's answers ran to the limit, a quarter of them so (bench/README.md, "The loop guard and the E5 default"). A sampler penalty (llama-server's repeat or DRY
penalties) cannot tell this from what an extractive answer must do, copy the words of its context;
the loop itself is plain to see in the answer: the same run of units (a CJK character, a word or a whole
link; punctuation and case ignored) a second time, the run at least `REPEAT_UNITS` units and
`REPEAT_LETTERS` letters long (six words; eight CJK characters, since a Chinese span may well name
"四川大学华西" twice: "四川大学华西医院是四川大学华西临床医学院的附属医院"). `LoopGuard` watches the streamed text, holds
back only the last units that could still turn out to begin a repeat (the first unit never waits),
and when a repeat appears it gives the text up to where the repeat began, less the separators before
it, and says the answer is over. Used for the completion style's one-line answers, where such a run
said twice is hardly ever part of a span; a chat answer of several sentences may legitimately repeat one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag.core.cjk import CJK_CHARS, is_cjk

REPEAT_UNITS = 6
REPEAT_LETTERS = 8
_MAX_RUN = REPEAT_LETTERS  # units: a run of one-letter units is as long as its letters
# A unit: a link (whole), a CJK character, or a word.
_UNIT = re.compile(f"[a-z][a-z0-9+.-]*://[^\\s)\\]>\"']+|[{CJK_CHARS}]|[^\\W_{CJK_CHARS}]+", re.IGNORECASE)
_SEPARATOR = re.compile(r"[,，、;；:：]|[.!?。！？](?=\s)")
_TRAILING = " \t,，、;；:：-—"


@dataclass
class LoopGuard:
    """Feed it the answer's pieces; it returns what may be shown and whether the answer has looped."""

    text: str = ""
    shown: int = 0  # characters of `text` given out so far
    looped: bool = False

    def feed(self, piece: str) -> str:
        """The text that may be shown now (possibly ""); once the answer has looped, nothing more."""
        if self.looped:
            return ""
        self.text += piece
        found = list(_UNIT.finditer(self.text))
        # A word or link that reaches the end of the text may still grow ("1" -> "1887"): not complete yet.
        last_open = bool(found) and found[-1].end() == len(self.text) and not is_cjk(found[-1].group())
        complete = found[:-1] if last_open else found
        if (repeat := _repeat(complete)) is not None:
            self.looped = True
            first, again = repeat
            cut = complete[again].start()
            # "X, she lives on Y, she lives on Y": back to the clause's start, when it is after the first time
            cut = _last_separator(self.text, max(self.shown, complete[first].end()), cut) or cut
            return self._give(self.text[:cut].rstrip(_TRAILING))
        hold_from = max(1, len(complete) - _MAX_RUN + 1)  # a repeat found later starts at one of these
        if hold_from >= len(found):
            return self._give(self.text)
        upto = found[hold_from - 1].end()
        # The clause being written waits too (a repeat is cut back to its start), up to as many units again.
        upto = _last_separator(self.text, found[max(0, hold_from - 1 - _MAX_RUN)].end(), upto) or upto
        return self._give(self.text[:upto])

    def rest(self) -> str:
        """What is still held back, once the answer has ended by itself."""
        return "" if self.looped else self._give(self.text)

    def _give(self, upto: str) -> str:
        if len(upto) <= self.shown:
            return ""
        out, self.shown = upto[self.shown :], len(upto)
        return out


def _repeat(units: list[re.Match[str]]) -> tuple[int, int] | None:
    """Where a run of units first stands and where it begins again, if one does (unit indexes)."""
    first: dict[tuple[str, ...], int] = {}
    words = [m.group().casefold() for m in units]
    for start in range(len(words)):
        run = _run(words, start)
        if run is None:
            continue
        earlier = first.setdefault(run, start)
        if earlier != start:
            while earlier > 0 and words[earlier - 1] == words[start - 1]:  # the repeat began before the run
                earlier, start = earlier - 1, start - 1
            return earlier, start
    return None


def _run(words: list[str], start: int) -> tuple[str, ...] | None:
    """The shortest run from `start` of REPEAT_UNITS units and REPEAT_LETTERS letters (None: the text ends first)."""
    letters = 0
    for end in range(start, min(len(words), start + _MAX_RUN)):
        letters += len(words[end])
        if end - start + 1 >= REPEAT_UNITS and (letters >= REPEAT_LETTERS or end - start + 1 == _MAX_RUN):
            return tuple(words[start : end + 1])
    return None


def _last_separator(text: str, lo: int, hi: int) -> int | None:
    """The position of the last clause separator in text[lo:hi], if there is one."""
    found = [m.start() for m in _SEPARATOR.finditer(text, lo, hi)]
    return found[-1] if found else None
