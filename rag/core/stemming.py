"""English words reduced to their Snowball stems ("satellites" and "satellite" alike), for the lexical
index and for the attribution's look for a question's terms in a source."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import Stemmer

_local = threading.local()


def stemmer() -> Stemmer.Stemmer:
    # A Snowball stemmer keeps state: one per thread.
    found = getattr(_local, "stemmer", None)
    if found is None:
        found = _local.stemmer = Stemmer.Stemmer("english")
    return found


def stems(words: Sequence[str]) -> list[str]:
    """The stems of `words` (words of other scripts come back as they are)."""
    return list(stemmer().stemWords(list(words)))
