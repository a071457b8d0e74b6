"""Boilerplate in chunks of real documentation: the HTML (and plain text) under /usr/share/doc.

    .venv/bin/python bench/boilerplate.py [--root /usr/share/doc] [--json bench/results/boilerplate.json]

Every HTML page under --root goes through the loader and the chunker the pipeline uses (`ingest.loaders
.parse`, the embedder's tokenizer, RAG_CHUNK_TOKENS / RAG_CHUNK_OVERLAP). The rule for a boilerplate
chunk, decided from the source page and not from the extractor:

- a *navigation line* of a chunk is one that, once every link text of its page (the text of each `<a>`)
  and the words Next, Previous, Prev, Up, Home, Index, Contents, Top, "Jump to" are taken out, keeps
  fewer than 3 letters (so "Next: Simple Example, Up: Using libffi [Index]" is one, and so is an index
  entry "ffi_call: | | The Basics");
- a chunk is *boilerplate* when navigation lines hold at least half of its non-space characters.

Also counted: chunks that still hold ANSI escape sequences (or their remains, "[1m") or control characters, in every file the
loader takes under --root (text files too; `NAME.txt.gz`, `.md.gz` and `.html.gz` are unpacked first,
as a user would before ingesting them, among them man-db's manual with its terminal colour codes). The results give the share of boilerplate chunks and the
characters of non-boilerplate text kept, so a drop in boilerplate that also lost content would show.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, provenance  # noqa: E402
from ingest.detect import classify  # noqa: E402
from ingest.loaders import parse  # noqa: E402
from ingest.models import DocKind  # noqa: E402
from ingest.pipeline import make_chunker  # noqa: E402
from rag.core.config import Settings  # noqa: E402
from rag.core.errors import RagError  # noqa: E402

NAV_WORDS = re.compile(r"\b(next|previous|prev|up|home|index|contents|top|jump to)\b", re.I)
LETTER = re.compile(r"[^\W\d_]")
# An escape or control character, or what an older loader left of a colour code once it dropped the ESC.
DIRTY = re.compile(r"\x1b|[\x00-\x08\x0b\x0e-\x1f\x7f]|\[[0-9;]{1,8}m")


def link_texts(html: bytes) -> list[str]:
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(html.decode("utf-8", "replace"))
    texts = {" ".join(a.text(deep=True).split()) for a in tree.css("a")}
    return sorted((t for t in texts if t), key=len, reverse=True)


def is_navigation(line: str, links: list[str]) -> bool:
    rest = " ".join(line.split())
    for text in links:
        if text in rest:
            rest = rest.replace(text, " ")
    return len(LETTER.findall(NAV_WORDS.sub(" ", rest))) < 3


def boilerplate(chunk: str, links: list[str]) -> bool:
    total = sum(len(line.replace(" ", "")) for line in chunk.splitlines())
    nav = sum(len(line.replace(" ", "")) for line in chunk.splitlines() if is_navigation(line, links))
    return total > 0 and nav * 2 >= total


def measure(root: Path) -> dict:
    settings = Settings()
    chunker = make_chunker(settings)
    pages = chunks = bad = kept_chars = dirty = files = failed = 0
    examples: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        data = path.read_bytes()
        if path.suffix == ".gz":
            if Path(path.stem).suffix not in (".txt", ".md", ".html", ".htm"):
                continue
            data, path = gzip.decompress(data), path.with_suffix("")
        try:
            detection = classify(data, path.name)
            doc = parse(detection.kind, data, path.name, text=detection.text, encoding=detection.encoding)
        except RagError:
            failed += 1
            continue
        files += 1
        pieces = [c.text for c in chunker.chunk(doc, "d")]
        dirty += sum(bool(DIRTY.search(c)) for c in pieces)
        if detection.kind is not DocKind.HTML:
            continue
        pages += 1
        links = link_texts(data)
        for text in pieces:
            chunks += 1
            if boilerplate(text, links):
                bad += 1
                if len(examples) < 8:
                    examples.append(f"{path.relative_to(root)}: {' '.join(text.split())[:120]}")
            else:
                kept_chars += len(text.replace(" ", ""))
    return {
        "files_loaded": files,
        "files_refused": failed,
        "html_pages": pages,
        "html_chunks": chunks,
        "boilerplate_chunks": bad,
        "boilerplate_share": round(bad / max(chunks, 1), 4),
        "content_chars_in_other_chunks": kept_chars,
        "chunks_with_ansi_or_control": dirty,
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("/usr/share/doc"))
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "boilerplate.json")
    parser.add_argument("--label", default="current loader")
    args = parser.parse_args(argv)
    print(header(), flush=True)
    started = time.perf_counter()
    result = measure(args.root)
    result.update(
        label=args.label, root=str(args.root), seconds=round(time.perf_counter() - started, 1), provenance=provenance()
    )
    runs = json.loads(args.json.read_text()) if args.json.exists() else {}
    runs[args.label] = result
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(runs, indent=2, ensure_ascii=False))
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=1))
    for line in result["examples"]:
        print("  boilerplate:", line)


if __name__ == "__main__":
    main()
