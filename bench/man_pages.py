"""Man pages of this machine read as text: how many load, how many fail and why, what markup is left.

Takes a sample of `/usr/share/man/man*/*.gz` (seeded) and every page under `/usr/share/man/zh_CN`,
loads each through the real loading path (`ingest.loading.load_document`: gzip, detection, groff in the
parser worker) and prints, per set: pages, loaded as man pages, refused (with the first reasons: a
`.so` link page is refused by design), pages with troff markup left in their text (`\\fB`, a request
line, a tbl marker), tables found, sections per page, and the time per page.

    .venv/bin/python -m bench.man_pages                 # 300 English pages and the Chinese ones
    .venv/bin/python -m bench.man_pages --sample 2000
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time
from collections import Counter
from pathlib import Path

from bench._provenance import header
from ingest.loading import load_document
from ingest.models import DocKind
from ingest.sandbox import ParserPool
from rag.core.config import Settings
from rag.core.errors import RagError

_MARKUP = re.compile(r"\\f[BIRP1-4]|^[.'](?:TH|SH|SS|RS|RE|TS|TE|TP|IP|PP|B|I|BR)\b|RAGTBL|\x08", re.M)


def run(pages: list[Path], settings: Settings, pool: ParserPool) -> dict[str, object]:
    kinds: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    markup, tables, sections, seconds = [], 0, [], []
    for path in pages:
        started = time.perf_counter()
        try:
            doc = load_document(path.read_bytes(), path.name, settings, pool=pool)
        except RagError as exc:
            refused[re.sub(r"\S+\.\d\w*(?:\.gz)?", "PAGE", exc.message)[:90]] += 1
            continue
        seconds.append(time.perf_counter() - started)
        kinds[doc.kind.value] += 1
        if doc.kind is DocKind.MAN and _MARKUP.search(doc.text):
            markup.append(path.name)
        tables += sum(1 for s in doc.sections if s.table_header)
        sections.append(len(doc.sections))
    return {
        "pages": len(pages),
        "kinds": dict(kinds),
        "refused": sum(refused.values()),
        "reasons": refused.most_common(3),
        "markup_left": markup[:5],
        "markup_pages": len(markup),
        "tables": tables,
        "sections_median": statistics.median(sections) if sections else 0,
        "s_per_page_median": round(statistics.median(seconds), 3) if seconds else 0,
        "s_per_page_p95": round(sorted(seconds)[int(len(seconds) * 0.95)], 3) if seconds else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sample", type=int, default=300, help="English pages to sample")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    english = sorted(Path("/usr/share/man").glob("man*/*.gz"))
    chinese = sorted(Path("/usr/share/man/zh_CN").glob("man*/*.gz"))
    random.Random(args.seed).shuffle(english)
    settings = Settings()
    pool = ParserPool(memory_mb=settings.parse_memory_mb, max_workers=1)
    print(header())
    try:
        for label, pages in (("en", english[: args.sample]), ("zh_CN", chinese)):
            print(label, run(pages, settings, pool), flush=True)
    finally:
        pool.close()


if __name__ == "__main__":
    main()
