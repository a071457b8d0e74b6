"""Where a benchmark's numbers come from: the commit, the date, the machine and its load.

Every results file a benchmark writes carries `provenance()` (JSON files under the key "provenance";
printed reports, which are kept with `tee`, start with `header()`), so a number quoted in a README can be
traced to the code and the conditions that produced it. The record itself is the product's
(`rag.core.provenance`), which `rag eval` writes too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rag.core.provenance import provenance, summary

__all__ = ["header", "provenance", "with_provenance", "write_json"]


def header() -> str:
    """One line for the top of a printed report."""
    return f"# {summary(provenance())}"


def with_provenance(results: Any) -> dict[str, Any]:
    """`results` with the provenance added: a dict gains the key, anything else goes under "results"."""
    if isinstance(results, dict):
        return {"provenance": provenance(), **results}
    return {"provenance": provenance(), "results": results}


def write_json(path: Path, results: Any, **dump: Any) -> None:
    """Write `results` as JSON with the provenance, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dump.setdefault("indent", 2)
    path.write_text(json.dumps(with_provenance(results), **dump) + "\n", encoding="utf-8")


def write_report(out: Path | str, results: dict[str, Any], text: str) -> None:
    """`out`.json (the results with their provenance) and `out`.txt (the printed report), and print it."""
    write_json(Path(f"{out}.json"), results, ensure_ascii=False)
    Path(f"{out}.txt").write_text(text, encoding="utf-8")
    print("\n" + text)
