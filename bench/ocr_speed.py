"""OCR speed levers, one at a time: the production engine (`make_engine`, `recognize`) against variants
that each change one setting, on the same rough two-column pages (bench/scanned_rough.py's, 200 dpi, as
the PDF loader hands them over: at most 2,000 pixels on the long side), in this process.

Levers: onnxruntime threads, the detector's input size (`Global.max_side_len`: the page is shrunk to it
before detection, and the lines are cut from the shrunk page), the recogniser's batch size, the 180-degree
line classifier (off in production), and the characters' boxes that the word spaces need. The variants
run interleaved, round by round, so that the machine's other load falls on all of them alike; reported:
median seconds a page, pages/s, median CPU seconds a page (all of the process's threads: less moved by
the machine's other load than the wall clock), and the character error rate of the page text (whitespace collapsed).

    .venv/bin/python -m bench.ocr_speed                 # 2 pages x 2 rounds
    .venv/bin/python -m bench.ocr_speed --pages 4 --rounds 3 --out bench/results/ocr_speed
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench.scanned import cer
from bench.scanned_rough import HEADER, pick
from ingest.loaders import ocr
from ingest.loaders._builder import DocumentBuilder
from ingest.models import DocKind
from rag.core.errors import DocumentRejected
from tests import scans

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, dict[str, Any]] = {
    "production": {},
    "2 threads": {"threads": 2},
    "max_side_len 1600": {"params": {"Global.max_side_len": 1600}},
    "max_side_len 1280": {"params": {"Global.max_side_len": 1280}},
    "rec batch 16": {"params": {"Rec.rec_batch_num": 16}},
    "rec batch 6 (RapidOCR's default)": {"params": {"Rec.rec_batch_num": 6}},
    "line classifier on": {"params": {"Global.use_cls": True}},
    "no character boxes (no word spaces)": {"raw": True},
}


def engine(variant: dict[str, Any]) -> Any:
    """The production engine with the variant's settings over it."""
    return ocr.make_engine(threads=variant.get("threads", 1), params=variant.get("params"))


def read(eng: Any, image: np.ndarray, raw: bool) -> str:
    """The page's text as production lays it out; `raw`: the recogniser's text without word boxes."""
    if raw:
        eng = _WithoutCharacterBoxes(eng)
    builder = DocumentBuilder()
    ocr.add_read_page(builder, 1, ocr.PageLines(ocr.recognize(eng, image)), min_confidence=0.0)
    try:
        return builder.build("page.png", DocKind.IMAGE).text
    except DocumentRejected:  # nothing read
        return ""


class _WithoutCharacterBoxes:
    """An engine whose calls ask for no word or character boxes (what the recogniser alone gives)."""

    def __init__(self, eng: Any) -> None:
        self.eng = eng

    def __call__(self, image: Any, **_: Any) -> Any:
        return self.eng(image)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    datasets.add_options(parser, "squad")
    parser.add_argument("--pages", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ocr_speed")
    args = parser.parse_args(argv)
    datasets.use(args)
    pages, _ = pick(args.squad, args.pages, 0)
    images, references = [], []
    for n, (_, left, right, _) in enumerate(pages):
        page = scans.rough(scans.two_columns(left, right, HEADER, str(n + 1), dpi=200, serif=n % 2 == 1), seed=n)
        scale = ocr.MAX_SIDE / max(page.size)
        page = page.convert("L").resize(
            (round(page.width * scale), round(page.height * scale)), Image.Resampling.LANCZOS
        )
        images.append(np.asarray(page))
        references.append(f"{HEADER}\n\n{left}\n\n{right}\n\n{n + 1}")
    engines = {name: engine(VARIANTS[name]) for name in args.variants}
    for name, eng in engines.items():  # load the models, warm the sessions
        read(eng, images[0][:400], VARIANTS[name].get("raw", False))
    lines = [header(), f"# load average at start: {os.getloadavg()}"]
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    cpu: dict[str, list[float]] = {name: [] for name in engines}
    errors: dict[str, list[tuple[int, int]]] = {name: [] for name in engines}
    for round_ in range(args.rounds):
        for image, reference in zip(images, references, strict=True):
            for name, eng in engines.items():
                started, used = time.perf_counter(), time.process_time()
                text = read(eng, image, VARIANTS[name].get("raw", False))
                seconds[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - used)
                if round_ == 0:
                    errors[name].append(cer(reference, text, False))
                print(f"  round {round_ + 1} {name}: {seconds[name][-1]:.1f} s", file=sys.stderr)
    lines.append(f"# load average at end: {os.getloadavg()}")
    lines.append(f"{'variant':<38} {'s/page (median)':>15} {'pages/s':>8} {'CPU s/page':>10} {'CER':>7}")
    results = {}
    for name in engines:
        median = statistics.median(seconds[name])
        rate = sum(d for d, _ in errors[name]) / max(sum(n for _, n in errors[name]), 1)
        used = statistics.median(cpu[name])
        results[name] = {
            "seconds": seconds[name],
            "cpu_seconds": cpu[name],
            "median_s": median,
            "pages_per_s": 1 / median,
            "median_cpu_s": used,
            "cer": rate,
        }
        lines.append(f"{name:<38} {median:>15.2f} {1 / median:>8.3f} {used:>10.2f} {rate:>7.2%}")
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(report + "\n", encoding="utf-8")
    write_json(args.out.with_suffix(".json"), {"variants": results, "load_average_end": os.getloadavg()})


if __name__ == "__main__":
    main()
