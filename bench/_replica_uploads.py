"""Uploads through the balancer while replicas are killed (bench/replicas.py `--uploads N --kill-every S`).

Each file is its own job (`wait=false`, a `job_id` of ours): a try cut off by a dying replica is sent
again, and 409 says the first one had arrived. Every `--kill-every` seconds one replica is killed with
SIGKILL and started again: the one running a job when there is one (its worker's owner token starts
with its pid), else the next in turn. Then the count: every job's state and file status, the documents
listed, chunks in the record and in Chroma, pending rows, and `rag store check`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import httpx
import psycopg

from bench._replica_stack import ReplicaStack

WORDS = ["harbour", "lighthouse", "granite", "ferry", "tide", "beacon", "channel", "keeper", "storm", "quay"]


def document_text(i: int, sections: int = 24) -> bytes:
    lines = [
        f"Report {i}, section {s}: the {WORDS[(i + s) % 10]} near pier {s * 7 + i} was inspected on day {s} "
        f"and the {WORDS[(i * s) % 10]} log lists {i * 100 + s} entries about the {WORDS[s % 10]}."
        for s in range(sections)
    ]
    return "\n\n".join(lines).encode()


def job_id(i: int) -> str:
    return f"bench-{i:04d}"


def send_one(client: httpx.Client, i: int, statuses: Counter[str], deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            response = client.post(
                "/v1/documents",
                params={"wait": "false", "job_id": job_id(i)},
                files={"files": (f"report-{i}.txt", document_text(i), "text/plain")},
            )
        except httpx.TransportError as exc:
            statuses[type(exc).__name__] += 1
            time.sleep(0.5)
            continue
        statuses[str(response.status_code)] += 1
        if response.status_code in (202, 409):
            return
        time.sleep(0.5)
    raise SystemExit(f"upload {i} was never accepted")


def _running_pids(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT worker FROM upload_jobs WHERE state = 'running' AND worker IS NOT NULL").fetchall()
    return [int(worker.split("-")[0]) for (worker,) in rows]


class Killer(threading.Thread):
    """Kills one replica every `every_s` and starts it again (a restart that takes longer delays the next)."""

    def __init__(self, stack: ReplicaStack, every_s: float) -> None:
        super().__init__(daemon=True)
        self.stack, self.every_s = stack, every_s
        self.done = threading.Event()
        self.events: list[dict[str, Any]] = []
        self._turn = 0

    def _victim(self) -> tuple[int, bool]:
        ports = sorted(self.stack.replicas)
        try:
            busy = set(_running_pids(self.stack.database_url))
        except psycopg.Error:
            busy = set()
        self._turn += 1
        running = [p for p in ports if self.stack.replicas[p].pid in busy]
        if running:  # each in turn, not always the first
            return running[self._turn % len(running)], True
        return ports[self._turn % len(ports)], False

    def run(self) -> None:
        began = time.monotonic()
        next_kill = began + self.every_s
        while not self.done.wait(max(0.0, next_kill - time.monotonic())):
            next_kill = time.monotonic() + self.every_s
            port, mid_job = self._victim()
            event = {"at_s": round(time.monotonic() - began, 1), "mid_job": mid_job}
            event.update(self.stack.kill_and_restart(port))
            self.events.append(event)
            print(f"killed {event}", flush=True)


def wait_ended(client: httpx.Client, count: int, deadline: float) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        for i in range(count):
            if jobs.get(job_id(i), {}).get("state") in ("done", "failed", "cancelled"):
                continue
            try:
                response = client.get(f"/v1/jobs/{job_id(i)}")
            except httpx.TransportError:
                continue
            if response.status_code == 200:
                jobs[job_id(i)] = response.json()
        if len(jobs) == count and all(j["state"] in ("done", "failed", "cancelled") for j in jobs.values()):
            return jobs
        time.sleep(1.0)
    raise SystemExit(f"jobs not ended in time: {Counter(j['state'] for j in jobs.values())}")


def _chroma_count(url: str) -> int:
    import chromadb

    where = urlparse(url)
    return int(chromadb.HttpClient(host=where.hostname, port=where.port).get_collection("default").count())


def verify(stack: ReplicaStack, client: httpx.Client, jobs: dict[str, dict[str, Any]], count: int) -> dict[str, Any]:
    results = [r for j in jobs.values() for r in j.get("results", [])]
    documents = client.get("/v1/documents", params={"limit": 1000}).json()
    sources = Counter(d["source"] for d in documents["documents"])
    expected = {f"report-{i}.txt" for i in range(count)}
    chunks = sum(d["chunks"] for d in documents["documents"])
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        record = conn.execute("SELECT count(*), count(DISTINCT chunk_id) FROM chunks").fetchone()
        pending = conn.execute("SELECT count(*) FROM documents WHERE state != 'indexed'").fetchone()
        attempts = conn.execute(
            "SELECT count(*) FILTER (WHERE attempts > 1), max(attempts) FROM upload_jobs"
        ).fetchone()
    assert record is not None and pending is not None and attempts is not None
    check = subprocess.run(
        [sys.executable, "-m", "rag.cli", "store", "check", "--json"], capture_output=True, text=True, env=stack.env
    )
    try:
        check_report: Any = json.loads(check.stdout)
    except ValueError:
        check_report = check.stdout[-2000:] + check.stderr[-2000:]
    return {
        "jobs": dict(Counter(j["state"] for j in jobs.values())),
        "file_results": dict(Counter(r["status"] for r in results)),
        "not_indexed_reasons": [(r.get("filename"), r.get("reason")) for r in results if r["status"] == "failed"],
        "indexed": len(expected & set(sources)),
        "lost": sorted(expected - set(sources)),
        "duplicated": sorted(s for s, n in sources.items() if n > 1),
        "documents_listed": documents["total"],
        "chunks_listed": chunks,
        "chunks_in_record": record[0],
        "distinct_chunk_ids_in_record": record[1],
        "chunks_in_chroma": _chroma_count(str(stack.env["RAG_CHROMA_URL"])),
        "documents_not_indexed": pending[0],
        "jobs_taken_again": attempts[0],
        "most_attempts": attempts[1],
        "store_check_exit": check.returncode,
        "store_check": check_report,
    }


def uploads_under_kills(stack: ReplicaStack, count: int, kill_every_s: float, clients: int) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    killer = Killer(stack, kill_every_s)
    began = time.monotonic()
    deadline = began + 3600
    with httpx.Client(base_url=stack.api, timeout=120) as client:
        killer.start()
        try:
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(lambda i: send_one(client, i, statuses, deadline), range(count)))
            sent_s = time.monotonic() - began
            jobs = wait_ended(client, count, deadline)
        finally:
            killer.done.set()
            killer.join()
        seconds = time.monotonic() - began
        time.sleep(3.0)  # the last restarted replica's health is checked in again
        counts = verify(stack, client, jobs, count)
    return {
        "uploads": count,
        "replicas": len(stack.replicas),
        "kill_every_s": kill_every_s,
        "lease_s": float(stack.env["RAG_JOB_LEASE_S"]),
        "seconds_to_send": round(sent_s, 1),
        "seconds_to_all_ended": round(seconds, 1),
        "upload_statuses": dict(statuses),
        "kills": killer.events,
        **counts,
    }
