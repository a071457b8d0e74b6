"""Citation checking: every [Sn] in an answer must name a source that was in the prompt."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

# [S1], [S1, S3], [S1][S2], also the full-width brackets and comma a model may use in Chinese text.
_GROUP = re.compile(r"[\[【［]\s*(S\d+(?:\s*[,，;；]\s*S\d+)*)\s*[\]】］]", re.IGNORECASE)
_ID = re.compile(r"S(\d+)", re.IGNORECASE)


@dataclass
class CitationCheck:
    valid: list[str] = field(default_factory=list)  # ids in order of first mention
    invalid: list[str] = field(default_factory=list)


def cited_ids(text: str) -> list[str]:
    """The source ids cited in `text`, in order of first mention, without repeats."""
    seen: dict[str, None] = {}
    for group in _GROUP.finditer(text):
        for number in _ID.findall(group.group(1)):
            seen.setdefault(f"S{int(number)}", None)
    return list(seen)


def check_citations(text: str, in_prompt: Collection[str]) -> CitationCheck:
    """Split the cited ids into those that were in the prompt and those that were not."""
    check = CitationCheck()
    for source_id in cited_ids(text):
        (check.valid if source_id in in_prompt else check.invalid).append(source_id)
    return check
