"""How the embedding server should run its model on CPU: texts per forward pass, and one team of torch
threads against single-thread workers, on idle cores and beside a process that takes part of a core.

    .venv/bin/python bench/embedder_batch.py [--paragraphs 300] [--busy 0.25]

The texts are the chunks the pipeline makes of SQuAD paragraphs (the same corpus as
bench/ingest_throughput.py). Forward batches: SentenceTransformer.encode of all texts in one call (it
sorts them by length) at several batch sizes. Team against workers: the same texts in requests of 32
(as the pipeline sends them), encoded by one call with torch on every core, or by the server's
SentenceEmbedder (passes of the forward batch spread over one single-thread worker per core); then
again while a busy-loop process takes `--busy` of one core (what the ingest process does beside the
embedder on a 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header  # noqa: E402
from bench.ingest_throughput import BATCH, chunk_texts, write_corpus  # noqa: E402

BURN = """
import sys, time
busy = float(sys.argv[1]) * 0.04
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < busy:
        pass
    time.sleep(0.04 - busy)
"""


def rate(encode: object, requests: list[list[str]]) -> float:
    """Texts per second over all requests."""
    start = time.perf_counter()
    for request in requests:
        encode(request)  # type: ignore[operator]
    return sum(len(r) for r in requests) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paragraphs", type=int, default=300)
    parser.add_argument("--busy", type=float, default=0.25, help="share of one core the background process takes")
    parser.add_argument("--rounds", type=int, default=2)
    datasets.add_options(parser, "squad")
    args = parser.parse_args()
    datasets.use(args)
    print(header(), flush=True)

    import torch
    from sentence_transformers import SentenceTransformer

    from rag.core.config import Settings
    from rag.servers.embedding import SentenceEmbedder

    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(Path(tmp) / "corpus", args.paragraphs, 0, 0)
        texts = chunk_texts(Path(tmp) / "corpus")
    path = str(Settings().embed_model_dir)
    cores = os.cpu_count() or 1
    model = SentenceTransformer(path, device="cpu")
    served = SentenceEmbedder.from_settings(Settings(), device="cpu")
    forward = served.batch_size
    print(
        f"{len(texts)} chunks of {args.paragraphs} SQuAD paragraphs; {cores} cores; all-in-one-call encodes sort all texts"
    )

    print("\nforward batch (SentenceTransformer.encode, torch on every core), texts/s per round:")
    torch.set_num_threads(cores)
    model.encode(texts[:64])
    for batch in (4, 8, 16, 32, 64):
        rates = [rate(lambda t: model.encode(t, batch_size=batch), [texts]) for _ in range(args.rounds)]
        print(f"  batch {batch:>3}: " + "  ".join(f"{r:6.1f}" for r in rates))

    requests = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]

    def team(request: list[str]) -> object:
        return model.encode(request, batch_size=forward)

    def measure(label: str) -> None:
        torch.set_num_threads(cores)
        team_rates = [rate(team, requests) for _ in range(args.rounds)]
        torch.set_num_threads(1)
        worker_rates = [rate(served.encode, requests) for _ in range(args.rounds)]
        print(
            f"  {label:<28} team of {cores} threads {max(team_rates):6.1f}   {served.workers} single-thread workers "
            f"{max(worker_rates):6.1f}   workers / team {max(worker_rates) / max(team_rates):.2f}"
        )

    print(f"\nrequests of {BATCH} texts, forward batch {forward}, texts/s (best of {args.rounds}):")
    measure("idle cores")
    burner = subprocess.Popen([sys.executable, "-c", BURN, str(args.busy)])
    try:
        time.sleep(0.5)
        measure(f"a process busy {args.busy:.0%} of a core")
    finally:
        burner.kill()
        burner.wait()


if __name__ == "__main__":
    main()
