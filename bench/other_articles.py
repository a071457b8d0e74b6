"""Questions of articles that are not indexed, asked through the whole stack: how many are refused, by the
relevance floor (no model call) and by the likelihood floor (the model's line withheld), and what the
likelihood floor costs the questions whose article is indexed.

About half of the SQuAD articles (by a hash of the title; 30 of the 48 of the dev set) are indexed into one
collection through the API, one text file per article; a seeded sample of questions of the other half
("other") and of the indexed half ("indexed") is asked through POST /v1/chat. The stack runs with the
likelihood floor off (RAG_COMPLETION_LIKELIHOOD_FLOOR=0), so every line the model writes comes back with
its `done.likelihood`, and both decisions are scored in one run: "floor only" is what the stack answers
without the likelihood floor, "with likelihood >= F" withholds every line below F (the bundled generator's
floor unless `--floor`). F1 is SQuAD's token F1; a withheld or refused answer scores 0.

    .venv/bin/python -m bench.other_articles --squad path/to/squad-v1.1-dev.json --per-group 150 \\
        --out bench/results/other_articles
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import _datasets as datasets
from bench._provenance import header, write_report
from bench.real_docs.run import REQUEST_TIMEOUT_S, Stack
from rag.core.config import BUNDLED_GENERATORS
from rag.eval._metrics import strip_citations, token_f1

COLLECTION = "other-articles"


def indexed_half(title: str) -> bool:
    return int(hashlib.sha256(title.encode()).hexdigest(), 16) % 2 == 0


def questions(data: dict[str, Any], indexed: bool, n: int, seed: int) -> list[dict[str, Any]]:
    asked = [
        {"id": q["id"], "article": a["title"], "question": q["question"], "answers": [x["text"] for x in q["answers"]]}
        for a in data["data"]
        if indexed_half(a["title"]) == indexed
        for p in a["paragraphs"]
        for q in p["qas"]
    ]
    return random.Random(seed).sample(asked, min(n, len(asked)))


def upload(client: httpx.Client, data: dict[str, Any]) -> int:
    files = [
        ("files", (f"{a['title']}.txt", "\n\n".join(p["context"] for p in a["paragraphs"]).encode(), "text/plain"))
        for a in data["data"]
        if indexed_half(a["title"])
    ]
    reply = client.post("/v1/documents", files=files, data={"collection": COLLECTION})
    reply.raise_for_status()
    return len(files)


def ask(client: httpx.Client, q: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    reply = client.post(
        "/v1/chat",
        json={"messages": [{"role": "user", "content": q["question"]}], "collection": COLLECTION, "stream": False},
    )
    reply.raise_for_status()
    body = reply.json()
    done = body["done"]
    answer = strip_citations(body["answer"])
    return {
        **q,
        "answer": answer,
        "refused_by_floor": done.get("finish_reason") == "no_sources",
        "likelihood": done.get("likelihood"),
        "f1": 0.0 if done.get("finish_reason") == "no_sources" else token_f1(answer, q["answers"]),
        "seconds": round(time.monotonic() - started, 2),
    }


def score(rows: list[dict[str, Any]], floor: float) -> dict[str, Any]:
    """Refused shares and F1, floor only and with the likelihood floor, per group."""
    out: dict[str, Any] = {}
    for group in ("other", "indexed"):
        mine = [r for r in rows if r["group"] == group]
        n = len(mine) or 1
        withheld = [
            r for r in mine if not r["refused_by_floor"] and r["likelihood"] is not None and r["likelihood"] < floor
        ]
        floor_refused = sum(r["refused_by_floor"] for r in mine)
        f1 = sum(r["f1"] for r in mine) / n
        out[group] = {
            "n": len(mine),
            "refused_floor_only": round(floor_refused / n, 4),
            "withheld_by_likelihood": len(withheld),
            "refused_with_likelihood": round((floor_refused + len(withheld)) / n, 4),
            "f1_floor_only": round(f1, 4),
            "f1_with_likelihood": round(f1 - sum(r["f1"] for r in withheld) / n, 4),
            "right_withheld": sum(r["f1"] >= 0.5 for r in withheld),
        }
    return out


def report(result: dict[str, Any]) -> str:
    s, floor = result["scores"], result["floor"]
    lines = [
        result["header"],
        f"# {result['articles_indexed']} articles indexed of {result['articles']}; load average at start "
        f"{result['load_start']}, at end {result['load_end']}; {result['wall_s']} s",
        "",
        f"| group | n | refused, floor only | refused, with likelihood >= {floor} | withheld by it | "
        "F1, floor only | F1, with it | right (F1 >= 0.5) withheld |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group, label in (("other", "another article's question"), ("indexed", "its article indexed")):
        g = s[group]
        lines.append(
            f"| {label} | {g['n']} | {g['refused_floor_only']:.1%} | {g['refused_with_likelihood']:.1%} | "
            f"{g['withheld_by_likelihood']} | {g['f1_floor_only']:.3f} | {g['f1_with_likelihood']:.3f} | "
            f"{g['right_withheld']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    datasets.add_options(parser, "squad")
    parser.add_argument("--per-group", type=int, default=100, help="questions asked of each group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--floor", type=float, default=BUNDLED_GENERATORS["gemma-270m"].likelihood_floor)
    parser.add_argument("--out", type=Path, default=Path("bench/results/other_articles"))
    args = parser.parse_args(argv)
    datasets.use(args)
    data = datasets.read("squad")
    print(header(), flush=True)
    data_dir = Path(tempfile.mkdtemp(prefix="other-articles-"))
    stack = Stack(data_dir, "gemma-270m")
    stack.env["RAG_COMPLETION_LIKELIHOOD_FLOOR"] = "0"
    load_start, t0 = os.getloadavg(), time.monotonic()
    rows: list[dict[str, Any]] = []
    try:
        stack.start(1800)
        with httpx.Client(base_url=stack.url, timeout=REQUEST_TIMEOUT_S) as client:
            indexed = upload(client, data)
            for group, sample in (
                ("other", questions(data, False, args.per_group, args.seed)),
                ("indexed", questions(data, True, args.per_group, args.seed)),
            ):
                for n, q in enumerate(sample, 1):
                    row = {"group": group, **ask(client, q)}
                    rows.append(row)
                    print(
                        f"{group:7s} {n:3d} {row['likelihood']!s:7s} {row['f1']:.2f} {row['answer'][:70]!r}", flush=True
                    )
    finally:
        stack.stop()
    result = {
        "header": header(),
        "articles": len(data["data"]),
        "articles_indexed": indexed,
        "floor": args.floor,
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.monotonic() - t0, 1),
        "scores": score(rows, args.floor),
        "questions": rows,
    }
    write_report(args.out, result, report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
