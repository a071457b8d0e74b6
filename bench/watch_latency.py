"""`ingest --watch`: the time from a file's save to its being searchable, and the same for a rename and a
deletion.

The API runs as its own process with the real embedding server (no llama-server: nothing is generated);
`ingest DIR --watch` runs as its own process and works through that API, as it does beside `rag up`. A
file is saved (written and closed) one at a time, each a SQuAD paragraph; it is searchable once the
API's catalog lists it as indexed (retrieval returns only indexed documents), polled every 20 ms. The time
holds the watch's debounce (ingest/watch.py DEBOUNCE_MS) and settle check (SETTLE_S) and the upload,
chunking, embedding and indexing of the file.

    .venv/bin/python -m bench.watch_latency [--squad PATH --files 20 --json FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench._servers import server_env
from ingest.watch import DEBOUNCE_MS, SETTLE_S

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "bench" / "results" / "watch_latency.json"
POLL_S = 0.02


def names(api: str) -> set[str]:
    page = httpx.get(f"{api}/v1/documents", params={"state": "indexed", "limit": 1000}, timeout=30).json()
    return {d["source"] for d in page["documents"]}


def wait_for(api: str, holds: Callable[[set[str]], bool], started: float, limit_s: float = 120) -> float:
    """Seconds from `started` until the indexed names satisfy `holds`."""
    while not holds(names(api)):
        if time.perf_counter() - started > limit_s:
            raise SystemExit("the watch did not catch up within two minutes")
        time.sleep(POLL_S)
    return time.perf_counter() - started


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_s": round(statistics.median(values), 3),
        "p95_s": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3),
        "max_s": round(ordered[-1], 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    datasets.add_options(parser, "squad")
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    from tests.servers import free_port, start_api, start_embedding_server

    raw = datasets.read("squad")
    paragraphs = [p["context"] for a in raw["data"] for p in a["paragraphs"]]
    texts = random.Random(args.seed).sample(paragraphs, args.files)
    load_start = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, list[float]] = {"save": [], "rename": [], "delete": []}
    with tempfile.TemporaryDirectory(prefix="rag-watch-latency-") as tmp:
        workdir = Path(tmp)
        folder = workdir / "docs"
        folder.mkdir()
        embedder = start_embedding_server(workdir, server_env(workdir / "embedder"))
        env = server_env(workdir / "api", RAG_EMBED_URL=embedder.url, RAG_LLM_URL=f"http://127.0.0.1:{free_port()}")
        api = start_api(workdir, env, ready_path="/v1/collections")
        watch_env = {
            **env,
            "RAG_API_HOST": "127.0.0.1",
            "RAG_API_PORT": api.url.rsplit(":", 1)[1],
            "PYTHONPATH": str(ROOT),
        }
        log = (workdir / "watch.log").open("w")
        watcher = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", str(folder), "--watch"],
            env=watch_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while "watching" not in (workdir / "watch.log").read_text():
                time.sleep(0.1)
            time.sleep(1.5)  # the watcher's first answer: it watches from then on
            for i, text in enumerate(texts):
                path = folder / f"para-{i:03}.txt"
                path.write_text(text, encoding="utf-8")  # saved: written and closed
                results["save"].append(wait_for(api.url, lambda n, name=path.name: name in n, time.perf_counter()))
            for i in range(min(5, args.files)):
                old, new = folder / f"para-{i:03}.txt", folder / f"moved-{i:03}.txt"
                started = time.perf_counter()
                old.rename(new)
                results["rename"].append(
                    wait_for(api.url, lambda n, o=old.name, m=new.name: m in n and o not in n, started)
                )
            for i in range(min(5, args.files)):
                path = folder / f"moved-{i:03}.txt"
                started = time.perf_counter()
                path.unlink()
                results["delete"].append(wait_for(api.url, lambda n, name=path.name: name not in n, started))
        finally:
            watcher.terminate()
            watcher.wait(30)
            log.close()
            api.stop()
            embedder.stop()
    load_end = [round(x, 2) for x in os.getloadavg()]
    summary = {kind: stats(values) for kind, values in results.items()}
    print(
        f"load average at start {load_start}, at end {load_end} (2 cores); debounce {DEBOUNCE_MS} ms, "
        f"settle {SETTLE_S} s"
    )
    for kind, s in summary.items():
        print(
            f"{kind:<8} to searchable ({len(results[kind])} files)   p50 {s['p50_s']:.2f} s   p95 {s['p95_s']:.2f} s"
            f"   max {s['max_s']:.2f} s"
        )
    write_json(
        args.json,
        {
            "summary": summary,
            "load_avg": {"start": load_start, "end": load_end},
            "debounce_ms": DEBOUNCE_MS,
            "settle_s": SETTLE_S,
            "runs": results,
        },
    )


if __name__ == "__main__":
    main()
