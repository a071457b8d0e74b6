"""PostgreSQL restarted under chats, reads and uploads through the balancer (bench/replicas.py
`--postgres-restart S`): every answer by phase (before, while down, after), 503s with and without
Retry-After, other 5xx, how soon each kind answered 200 again, the uploads accepted that ended indexed,
and whether any replica restarted (the same pids before and after)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx

from bench._replica_chats import QUESTIONS, chat_body
from bench._replica_stack import ReplicaStack
from bench._replica_uploads import document_text


async def postgres_restart(
    stack: ReplicaStack, at_s: float, after_s: float, down_s: float, first_upload: int
) -> dict[str, Any]:
    pids = {port: r.pid for port, r in stack.replicas.items()}
    events: list[tuple[str, float, str, str | None]] = []  # (kind, started at, status, Retry-After)
    began = time.monotonic()
    stop = asyncio.Event()
    accepted: set[str] = set()

    def record(kind: str, at: float, response: httpx.Response | Exception) -> None:
        if isinstance(response, Exception):
            events.append((kind, at, type(response).__name__, None))
        else:
            events.append((kind, at, str(response.status_code), response.headers.get("retry-after")))

    async with httpx.AsyncClient(base_url=stack.api, timeout=120) as client:

        async def loop(kind: str, pause_s: float, send: Any) -> None:
            n = 0
            while not stop.is_set():
                at = time.monotonic() - began
                try:
                    response = await send(n)
                except httpx.HTTPError as exc:
                    record(kind, at, exc)
                else:
                    record(kind, at, response)
                    if kind == "upload" and response.status_code in (202, 409):
                        accepted.add(f"outage-{first_upload + n:04d}")
                        n += 1
                await asyncio.sleep(pause_s)

        def chat(n: int) -> Any:
            question = QUESTIONS[n % len(QUESTIONS)].format(i=n % 8)
            return client.post("/v1/chat", json=chat_body([{"role": "user", "content": question}]))

        def upload(n: int) -> Any:
            i = first_upload + n
            return client.post(
                "/v1/documents",
                params={"wait": "false", "job_id": f"outage-{i:04d}"},
                files={"files": (f"report-{i}.txt", document_text(i), "text/plain")},
            )

        loops = [
            asyncio.ensure_future(loop("chat", 0.2, chat)),
            asyncio.ensure_future(loop("chat", 0.2, chat)),
            asyncio.ensure_future(loop("read", 0.5, lambda n: client.get("/v1/documents"))),
            asyncio.ensure_future(loop("upload", 1.0, upload)),
        ]
        await asyncio.sleep(at_s)
        down_at = time.monotonic() - began
        away_s = await asyncio.to_thread(stack.restart_postgres, down_s)
        up_at = time.monotonic() - began
        await asyncio.sleep(after_s)
        stop.set()
        await asyncio.gather(*loops)
        jobs = await _wait_ended(client, sorted(accepted), time.monotonic() + 300)
    return {
        "postgres_stopped_at_s": round(down_at, 1),
        "postgres_back_at_s": round(up_at, 1),
        "postgres_away_s": away_s,
        "by_phase": _phases(events, down_at, up_at),
        "503_without_retry_after": sum(1 for _, _, s, ra in events if s == "503" and not ra),
        "other_5xx": sum(1 for _, _, s, _ in events if s.startswith("5") and s != "503"),
        "transport_errors": sum(1 for _, _, s, _ in events if not s.isdigit()),
        "first_200_after_back_s": {
            kind: next(
                (round(at - up_at, 1) for k, at, s, _ in events if k == kind and at >= up_at and s == "200"), None
            )
            for kind in ("chat", "read")
        },
        "uploads_accepted": len(accepted),
        "upload_jobs": dict(Counter(j.get("state") for j in jobs.values())),
        "upload_files": dict(Counter(r["status"] for j in jobs.values() for r in j.get("results", []))),
        "replicas_restarted": sum(1 for port, pid in pids.items() if stack.replicas[port].pid != pid),
        "replicas_alive": sum(1 for r in stack.replicas.values() if r.process.poll() is None),
    }


def _phases(events: list[tuple[str, float, str, str | None]], down_at: float, up_at: float) -> dict[str, Any]:
    phases: dict[str, dict[str, Counter[str]]] = {}
    for kind, at, status, retry_after in events:
        phase = "before" if at < down_at else "while_down" if at < up_at else "after"
        label = f"{status} (Retry-After {retry_after})" if retry_after else status
        phases.setdefault(phase, {}).setdefault(kind, Counter())[label] += 1
    return {phase: {kind: dict(c) for kind, c in kinds.items()} for phase, kinds in phases.items()}


async def _wait_ended(client: httpx.AsyncClient, ids: list[str], deadline: float) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        for job_id in ids:
            if jobs.get(job_id, {}).get("state") in ("done", "failed", "cancelled"):
                continue
            try:
                response = await client.get(f"/v1/jobs/{job_id}")
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                jobs[job_id] = response.json()
        if len(jobs) == len(ids) and all(j["state"] in ("done", "failed", "cancelled") for j in jobs.values()):
            break
        await asyncio.sleep(1.0)
    return jobs
