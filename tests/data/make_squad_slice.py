"""Rebuild `squad-v1.1-dev-slice.json` from the whole SQuAD v1.1 dev set (see the README here).

    python tests/data/make_squad_slice.py path/to/squad-v1.1-dev.json

The slice is the set's first ARTICLES whole articles, in the file's order and format (every paragraph
and question of those articles), written compactly: a test that reads "the first N paragraphs" reads
the same ones as in the whole set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SLICE = Path(__file__).resolve().parent / "squad-v1.1-dev-slice.json"
ARTICLES = 6  # 346 paragraphs: the tests chunk the first 300; the gate takes whole articles from all six


def main(source: str) -> None:
    whole = json.loads(Path(source).read_text(encoding="utf-8"))
    part = {**whole, "data": whole["data"][:ARTICLES]}
    SLICE.write_text(json.dumps(part, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
