"""API replicas behind the balancer (`rag up --replicas N`), measured from outside while it runs.

    rag up --replicas 2 &                                  # RAG_API_PORT=18700, RAG_LLM_URL=...:18710
    .venv/bin/python -m bench.replicas --api http://127.0.0.1:18700 --llm http://127.0.0.1:18710 --chats 20

1. `--chats` chats at once through the balancer: answered, 429 (with Retry-After), 5xx, and the most
   slots llama-server reported processing at once (polled every 50 ms).
2. One replica (`--kill-port`, default the first replica's) killed with SIGKILL while requests go through
   the balancer every 0.5 s for `--kill-watch-s`: their statuses (`rag up` restarts the replica).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench._provenance import header, write_json


async def burst(api: str, llm: str, chats: int) -> dict[str, Any]:
    peak, done = 0, False
    async with httpx.AsyncClient(timeout=300) as client:

        async def watch() -> None:
            nonlocal peak
            while not done:
                try:
                    slots = (await client.get(f"{llm}/slots")).json()
                    peak = max(peak, sum(1 for s in slots if s.get("is_processing")))
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.05)

        async def chat(i: int) -> tuple[int, str | None]:
            question = f"Who designed the Eiffel Tower? (question {i})"
            body = {"messages": [{"role": "user", "content": question}], "stream": False}
            r = await client.post(f"{api}/v1/chat", json=body)
            return r.status_code, r.headers.get("retry-after")

        watcher = asyncio.ensure_future(watch())
        started = time.monotonic()
        results = await asyncio.gather(*(chat(i) for i in range(chats)))
        done = True
        await watcher
    statuses = Counter(status for status, _ in results)
    return {
        "chats": chats,
        "seconds": round(time.monotonic() - started, 1),
        "statuses": dict(statuses),
        "retry_after": sorted({ra for _, ra in results if ra}),
        "peak_processing_slots": peak,
        "slots": httpx.get(f"{llm}/props").json().get("total_slots"),
    }


def replica_pid(port: int) -> int:
    """The API process listening on `port` (its environment says RAG_API_PORT)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve-api" in cmdline and f"RAG_API_PORT={port}".encode() in environ:
            return int(entry.name)
    raise SystemExit(f"no API replica on port {port}")


def kill_one(api: str, port: int, watch_s: float) -> dict[str, Any]:
    pid = replica_pid(port)
    os.kill(pid, signal.SIGKILL)
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        try:
            statuses[str(httpx.get(f"{api}/v1/collections", timeout=10).status_code)] += 1
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1
        time.sleep(0.5)
    return {"killed_pid": pid, "port": port, "watch_s": watch_s, "statuses": dict(statuses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", default="http://127.0.0.1:8000", help="the balancer")
    parser.add_argument("--llm", default="http://127.0.0.1:8081", help="llama-server, for its /slots")
    parser.add_argument("--chats", type=int, default=20)
    parser.add_argument("--kill-port", type=int, default=None, help="default: the balancer's port + 1")
    parser.add_argument("--kill-watch-s", type=float, default=15.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print(header(), flush=True)
    load = os.getloadavg()
    results = {"load_average": [round(x, 2) for x in load], "burst": asyncio.run(burst(args.api, args.llm, args.chats))}
    print(json.dumps(results["burst"]))
    port = args.kill_port or (httpx.URL(args.api).port or 80) + 1
    results["kill"] = kill_one(args.api, port, args.kill_watch_s)
    print(json.dumps(results["kill"]))
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
