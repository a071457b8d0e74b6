"""The benchmarks' README and results: every index link finds its section, every writer records provenance."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_index_link_points_at_a_section():
    text = (BENCH / "README.md").read_text()
    anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    index = text.split("## Index", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    assert rows, "no benchmark rows in the index"
    for row in rows:
        results = row.rstrip(" |").rsplit("|", 1)[1]
        links = re.findall(r"\]\(#([^)]+)\)", results)
        assert links, f"an index row points at no section: {row[:80]}"
        assert all(link in anchors for link in links), f"no section for {links}: {row[:80]}"


def test_every_benchmark_records_provenance():
    for path in sorted(BENCH.glob("*.py")):
        if path.name.startswith("_"):
            continue
        source = path.read_text()
        assert "header()" in source, f"{path.name} prints no provenance header"
        if re.search(r"args\.json\.write_text\(", source):  # results kept per run carry it per run
            assert "provenance()" in source, f"{path.name} writes JSON without its provenance"
