"""kill -9 at random points of an ingest of 500 files, through the `ingest` CLI on the store and through
the API: after each restart, and after the re-run, the catalog, the record, Chroma and the BM25 index
agree per document, and every file is indexed exactly once.

For each path, `--kills` points are drawn (seeded), one in each equal stretch of the first 90% of the
corpus, each a number of documents indexed plus a random delay of up to 0.5 s. At each point the running
ingest (CLI path) or the API it uploads to (API path) gets SIGKILL; then the product's own start-up runs
(`ingest` on an empty folder, or a new API) and every document is counted; the next run goes on from
there and is killed at the next point; the last run goes to the end. See `tests/crash_points.py`.

    PYTHONPATH=. nice -n 10 .venv/bin/python bench/crash_points.py [--files 500] [--kills 10] [--seed 13]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header, write_json  # noqa: E402
from tests.crash_points import PATHS, PathResult, run_series  # noqa: E402
from tests.servers import start_embedding_server  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def clean_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    return {**env, "RAG_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def table(result: PathResult) -> list[str]:
    lines = [
        f"{'path':<5} {'target':>6} {'delay':>6} {'killed at':>9} {'left':>5} {'indexed':>8} {'restart':>8}  result"
    ]
    for k in result.kills:
        at = "ended" if k.at is None else str(k.at)
        lines.append(
            f"{k.path:<5} {k.target:>6} {k.delay_s:>5.2f}s {at:>9} {k.left:>5} {k.after:>8} "
            f"{k.restart_s:>7.1f}s  {'; '.join(k.problems) or 'consistent'}"
        )
    lines.append(
        f"{result.path:<5} re-run to the end: {result.final_documents} documents indexed, "
        f"{'; '.join(result.final) or 'every file exactly once, all counts agree'} ({result.wall_s:.0f} s)"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--kills", type=int, default=10, help="kill points per path")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=RESULTS / "crash_points.json")
    datasets.add_options(parser, "squad")
    args = parser.parse_args()
    datasets.use(args)
    print(header(), flush=True)
    loads = [Path("/proc/loadavg").read_text().split()[:3]]
    print(f"load average at start: {' '.join(loads[0])}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        embedder = start_embedding_server(work, clean_env(work / "embedder-data"))
        try:
            env = {**clean_env(work / "unused"), "RAG_EMBED_URL": embedder.url}
            for path in PATHS:
                result = run_series(path, args.files, args.kills, args.seed, env, work, datasets.path("squad"))
                results.append(result)
                loads.append(Path("/proc/loadavg").read_text().split()[:3])
                print("\n".join(table(result)), f"\nload average: {' '.join(loads[-1])}", flush=True)
        finally:
            embedder.stop()
    failures = sum(bool(k.problems) for r in results for k in r.kills) + sum(bool(r.final) for r in results)
    hits = sum(k.at is not None for r in results for k in r.kills)
    print(f"{hits} of {sum(len(r.kills) for r in results)} kills hit a running ingest; {failures} inconsistent states")
    write_json(
        args.out,
        {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "files": args.files,
            "kills_per_path": args.kills,
            "seed": args.seed,
            "load_average": loads,
            "inconsistent": failures,
            "kills_that_hit": hits,
            "paths": [asdict(r) for r in results],
        },
        indent=1,
    )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
