"""The API's memory with many collections: one tiny file uploaded into each of N new collections, then
the API restarted on that store.

A fresh API (`rag serve-api`, the real embedding server, no llama-server: nothing here generates)
takes N uploads of one small text file, each into a collection of its own, over real HTTP. Printed:
how many were indexed and how many refused (`RAG_MAX_COLLECTIONS` caps the collections; 409 past it),
the API's RSS at start, its peak during the uploads and after them; then the time to restart on that
store and the RSS after the restart. The load average is printed before and after.

    PYTHONPATH=. .venv/bin/python bench/many_collections.py [--collections 1500] [--max-collections N]
        [--json bench/results/many_collections.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._provenance import header, write_json  # noqa: E402
from bench._servers import server_env  # noqa: E402
from bench.hostile_memory import MB, Sampler, rss  # noqa: E402
from tests.servers import Server, start_api, start_embedding_server  # noqa: E402


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fill(api: Server, n: int) -> dict[str, int]:
    """One small file into each of `n` new collections; the statuses counted."""
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=api.url, timeout=120) as client:
        for i in range(n):
            text = f"Note {i}: the shelf in room {i % 97} holds the ledger of year {1900 + i % 120}.".encode()
            response = client.post(
                "/v1/documents",
                files=[("files", (f"note-{i}.txt", text, "text/plain"))],
                data={"collection": f"c{i:05d}"},
            )
            key = str(response.status_code)
            statuses[key] = statuses.get(key, 0) + 1
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collections", type=int, default=1500)
    parser.add_argument("--max-collections", type=int, help="RAG_MAX_COLLECTIONS for the run (default: the setting's)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    print(header(), flush=True)
    before = load()
    print(f"load average: {before}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        extra = {"RAG_MAX_COLLECTIONS": str(args.max_collections)} if args.max_collections else {}
        embedder = start_embedding_server(root, server_env(root / "embedder"))
        env = server_env(root / "data", RAG_EMBED_URL=embedder.url, **extra)
        try:
            api = start_api(root, env, ready_path="/v1/collections")
            try:
                start = rss(api.pid)
                began = time.perf_counter()
                with Sampler(api.pid) as sampler:
                    statuses = fill(api, args.collections)
                upload_s = time.perf_counter() - began
                after = rss(api.pid)
            finally:
                api.stop()
            began = time.perf_counter()
            again = start_api(root, env, ready_path="/v1/collections")
            try:
                restart_s = time.perf_counter() - began
                time.sleep(2)
                restarted = rss(again.pid)
                listed = len(httpx.get(f"{again.url}/v1/collections", timeout=60).json()["collections"])
            finally:
                again.stop()
        finally:
            embedder.stop()
    row = {
        "uploads": args.collections,
        "max_collections": args.max_collections or "default",
        "statuses": statuses,
        "collections_after": listed,
        "upload_s": round(upload_s, 1),
        "rss_start_mb": round(start / MB, 1),
        "rss_peak_mb": round(sampler.peak / MB, 1),
        "rss_after_mb": round(after / MB, 1),
        "restart_s": round(restart_s, 1),
        "rss_after_restart_mb": round(restarted / MB, 1),
        "load_before": before,
        "load_after": load(),
    }
    print(
        f"{args.collections:,} uploads into new collections: {statuses} in {upload_s:.1f} s; "
        f"{listed:,} collections kept"
    )
    print(f"API RSS {row['rss_start_mb']} MB at start, {row['rss_peak_mb']} MB peak, {row['rss_after_mb']} MB after")
    print(f"restart {restart_s:.1f} s to answer; RSS {row['rss_after_restart_mb']} MB after it")
    print(f"load average: {row['load_after']}")
    if args.json:
        write_json(args.json, row)


if __name__ == "__main__":
    main()
