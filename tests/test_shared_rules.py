"""Rules that several parts apply have one definition, which they import: what counts as a CJK character
(`rag.core.cjk`), and a bounded least-recently-used map (cachetools' `LRUCache`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for top in ("rag", "ingest") for p in sorted((ROOT / top).rglob("*.py"))]
_IDEOGRAPHS = re.compile(r"\\u4e00|\\u9fff")  # the bounds of the unified ideographs, as a regex or a string writes them


def test_the_cjk_ranges_are_written_once() -> None:
    homes = [str(p.relative_to(ROOT)) for p in SOURCES if _IDEOGRAPHS.search(p.read_text())]
    assert homes == ["rag/core/cjk.py"]


def test_no_module_keeps_a_hand_written_lru_map() -> None:
    hand_written = [str(p.relative_to(ROOT)) for p in SOURCES if "popitem(last=False)" in p.read_text()]
    assert hand_written == []
