"""A small real corpus for the stack phase: SQuAD dev articles as text files, and questions about them.

    python3 bench/gpu/corpus.py SQUAD_JSON OUT_DIR [--articles 8] [--questions 60]

OUT_DIR/corpus/*.txt (one article each, paragraphs separated by blank lines) and OUT_DIR/corpus/questions.json.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("squad", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--articles", type=int, default=8)
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    articles = rng.sample(json.loads(args.squad.read_text(encoding="utf-8"))["data"], args.articles)
    corpus = args.out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for article in articles:
        text = "\n\n".join(p["context"] for p in article["paragraphs"])
        (corpus / f"{article['title']}.txt").write_text(text, encoding="utf-8")
    questions = [qa["question"] for a in articles for p in a["paragraphs"] for qa in p["qas"]]
    (corpus / "questions.json").write_text(json.dumps(rng.sample(questions, args.questions), indent=1))


if __name__ == "__main__":
    main()
