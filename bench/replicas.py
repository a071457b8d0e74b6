"""API replicas on PostgreSQL behind HAProxy, measured from outside while they run.

With `--start N` the benchmark starts the stack itself (bench/_replica_stack.py: PostgreSQL 18 from the
wheel, the embedding server, a Chroma server, llama-server with `--slots` slots, N replicas, HAProxy) and
runs, in this order, what is asked:

1. `--uploads N`: N uploads through the balancer while one replica is killed with SIGKILL every
   `--kill-every` s and started again (bench/_replica_uploads.py): indexed, lost, duplicated, the record,
   Chroma and `rag store check`.
2. `--chats N`: N chats at once through the balancer (bench/_replica_chats.py): answered, 429 with
   Retry-After, 5xx, the most slots llama-server processed at once; `--followups K`: K conversations whose
   follow-up goes to another replica than the first turn, with the prompt tokens llama-server reused.
3. `--postgres-restart S`: chats, reads and uploads through the balancer, PostgreSQL stopped S s in and
   started again (bench/_replica_outage.py): statuses by phase, 503s with Retry-After, recovery, the
   uploads accepted indexed, no replica restarted.

    nice -n 10 .venv/bin/python -m bench.replicas --start 3 --uploads 200 --kill-every 20 \\
        --json bench/results/replicas-uploads-200.json | tee bench/results/replicas-uploads-200.txt
    nice -n 10 .venv/bin/python -m bench.replicas --start 3 --slots 2 --chats 20 --followups 2 \\
        --postgres-restart 30 --json bench/results/replicas-chats.json

Without `--start`, against a running `rag up --replicas N` (`--api` the balancer, `--llm` llama-server):
the chats burst, then the replica on `--kill-port` killed while requests go through every 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench._provenance import header, write_json
from bench._replica_chats import burst, followups


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class LoadSampler(threading.Thread):
    """The 1-minute load average every 10 s while a phase runs: its lowest and highest."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(10.0):
            self.samples.append(round(os.getloadavg()[0], 2))

    def __enter__(self) -> LoadSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()

    def range(self) -> list[float]:
        return [min(self.samples), max(self.samples)] if self.samples else load()[:1] * 2


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


def seed(api: str, documents: int) -> None:
    """Index `documents` reports (waiting for each) so that chats find sources."""
    from bench._replica_uploads import document_text

    with httpx.Client(base_url=api, timeout=600) as client:
        for i in range(documents):
            files = {"files": (f"report-{i}.txt", document_text(i), "text/plain")}
            client.post("/v1/documents", files=files).raise_for_status()


def started(args: argparse.Namespace, results: dict[str, Any]) -> None:
    from bench._replica_outage import postgres_restart
    from bench._replica_stack import start_stack
    from bench._replica_uploads import uploads_under_kills

    began = time.monotonic()
    stack = start_stack(args.start, args.slots, args.lease_s, args.queue_max)
    results["stack"] = {"replicas": args.start, "slots": args.slots, "lease_s": args.lease_s}
    results["stack"].update(queue_max=args.queue_max, started_in_s=round(time.monotonic() - began, 1))
    print(json.dumps(results["stack"]), flush=True)
    try:
        if args.uploads:
            with LoadSampler() as sampler:
                results["uploads"] = uploads_under_kills(stack, args.uploads, args.kill_every, args.clients)
            results["uploads"]["load_average_1min_range"] = sampler.range()
            print(json.dumps(results["uploads"]), flush=True)
        if args.chats or args.followups or args.postgres_restart:
            seed(stack.api, args.seed_documents)
        if args.chats:
            with LoadSampler() as sampler:
                results["burst"] = asyncio.run(burst(stack.api, stack.llm_url, args.chats))
            results["burst"]["load_average_1min_range"] = sampler.range()
            print(json.dumps(results["burst"]), flush=True)
        if args.followups:
            replicas = [r.url for _, r in sorted(stack.replicas.items())]
            results["followups"] = followups(replicas, args.followups)
            print(json.dumps(results["followups"]), flush=True)
        if args.postgres_restart:
            outage = postgres_restart(
                stack, args.postgres_restart, args.after_restart_s, args.postgres_down_s, args.uploads + 1000
            )
            with LoadSampler() as sampler:
                results["postgres_restart"] = asyncio.run(outage)
            results["postgres_restart"]["load_average_1min_range"] = sampler.range()
            print(json.dumps(results["postgres_restart"]), flush=True)
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", type=int, default=0, help="start N replicas (and the stack) here")
    parser.add_argument("--slots", type=int, default=1, help="llama-server slots (with --start)")
    parser.add_argument("--lease-s", type=float, default=20.0, help="RAG_JOB_LEASE_S (with --start)")
    parser.add_argument("--queue-max", type=int, default=None, help="RAG_QUEUE_MAX (with --start)")
    parser.add_argument("--uploads", type=int, default=0)
    parser.add_argument("--kill-every", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=4, help="uploads sent at once")
    parser.add_argument("--seed-documents", type=int, default=8, help="indexed before the chats")
    parser.add_argument("--chats", type=int, default=0)
    parser.add_argument("--followups", type=int, default=0)
    parser.add_argument("--postgres-restart", type=float, default=0.0, help="stop PostgreSQL S s into the traffic")
    parser.add_argument("--postgres-down-s", type=float, default=3.0)
    parser.add_argument("--after-restart-s", type=float, default=30.0)
    parser.add_argument("--api", default="http://127.0.0.1:8000", help="the balancer (without --start)")
    parser.add_argument("--llm", default="http://127.0.0.1:8081", help="llama-server, for its /slots")
    parser.add_argument("--kill-port", type=int, default=None, help="default: the balancer's port + 1")
    parser.add_argument("--kill-watch-s", type=float, default=15.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started_as = header()  # the provenance written with the results is the one at their end
    print(started_as, flush=True)
    results: dict[str, Any] = {"command": " ".join(sys.argv[1:]), "started": started_as, "load_average": load()}
    if args.start:
        started(args, results)
    else:
        results["burst"] = asyncio.run(burst(args.api, args.llm, args.chats or 20))
        print(json.dumps(results["burst"]))
        port = args.kill_port or (httpx.URL(args.api).port or 80) + 1
        results["kill"] = kill_one(args.api, port, args.kill_watch_s)
        print(json.dumps(results["kill"]))
    results["load_average_after"] = load()
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
