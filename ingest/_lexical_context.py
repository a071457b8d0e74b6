"""What BM25 searches beside a chunk's text, and the file-name heuristic that decides it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def lexical_context(metadata: Mapping[str, Any]) -> str:
    """What BM25 searches beside a chunk's text: its heading path and its file's name, unless that is an id.

    A chunk often never names its subject (the heading or the title does): indexed with the title,
    BM25 recall@5 rose from 0.934 to 0.971 on CMRC and from 0.942 to 0.948 on SQuAD. A generated name
    (`squad-v1.1-dev-00092`, `scan_000123`, a hash) says nothing about the content and only adds
    shared terms to every chunk: indexed with such stems, hybrid R@1 fell from 0.900 to 0.867 on a
    30-question SQuAD slice of `rag eval` (0.900 to 0.883 on 60); without them, on 200 questions,
    hybrid is unchanged (R@1 0.880, R@5 0.970) and lexical R@1/R@5 rise from 0.865/0.970 to 0.870/0.975.
    """
    source = str(metadata.get("source", ""))
    stem = source.rsplit(".", 1)[0].replace("_", " ").replace("-", " ")
    if is_opaque_name(stem):
        stem = ""
    return " ".join(part for part in (str(metadata.get("heading", "")), stem) if part)


_OPAQUE_PART = re.compile(r"0\d{2,}|\d{6,}|(?=[a-z]*\d)(?=\d*[a-z])[0-9a-f]{8,}", re.IGNORECASE)


def is_opaque_name(stem: str) -> bool:
    """Whether a file name reads as a generated id: a zero-padded counter, a long number or a hex hash."""
    return any(_OPAQUE_PART.fullmatch(part) for part in stem.split())
