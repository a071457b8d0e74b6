"""Two API replicas behind a real HAProxy on one PostgreSQL and one Chroma server: uploads spread over
them, the replica running a job is killed with SIGKILL and restarted, and every file ends indexed once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from rag.deploy.balancer import haproxy_command, haproxy_config
from tests.servers import Server, free_port, start_server

FILES = 10
LEASE_S = 4


def _text(i: int) -> bytes:
    words = ["harbour", "lighthouse", "granite", "ferry", "tide", "beacon", "channel", "keeper", "storm", "quay"]
    lines = [
        f"Report {i}, section {s}: the {words[(i + s) % 10]} near pier {s * 7 + i} was inspected on day {s} "
        f"and the {words[(i * s) % 10]} log lists {i * 100 + s} entries about the {words[s % 10]}."
        for s in range(80)
    ]
    return "\n\n".join(lines).encode()


def _replica(port: int, env: dict[str, str], log_dir: Path) -> Server:
    env = {**env, "RAG_API_HOST": "127.0.0.1", "RAG_API_PORT": str(port)}
    command = [sys.executable, "-m", "rag.cli", "serve-api"]
    return start_server("api", command, port, log_dir, env=env, ready_path="/v1/collections")


def _upload(client: httpx.Client, i: int) -> None:
    """Send one file as its own job; a try cut off by a dying replica is sent again (409: it had arrived)."""
    last = ""
    for _ in range(120):
        try:
            response = client.post(
                "/v1/documents",
                params={"wait": "false", "job_id": f"job-{i:04d}"},
                files={"files": (f"report-{i}.txt", _text(i), "text/plain")},
            )
        except httpx.TransportError as exc:
            last = repr(exc)
            time.sleep(0.5)
            continue
        if response.status_code in (202, 409):
            return
        assert response.status_code in (502, 503), response.text
        last = f"{response.status_code} {response.text[:300]}"
        time.sleep(0.5)
    raise AssertionError(f"file {i} was never accepted: {last}")


def _running_worker(url: str, deadline: float) -> tuple[str, int]:
    """(job id, pid) of a job being indexed now: the worker's owner token starts with its pid."""
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT id, worker FROM upload_jobs WHERE state = 'running' LIMIT 1").fetchone()
            if row is not None:
                return row[0], int(row[1].split("-")[0])
            time.sleep(0.05)
    raise AssertionError("no job was ever running")


@pytest.mark.timeout(300)
def test_uploads_survive_a_replica_killed_and_restarted(
    database_url: str, chroma_server: Server, ingest_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **ingest_env,
        "RAG_DATABASE_URL": database_url,
        "RAG_CHROMA_MODE": "server",
        "RAG_CHROMA_URL": chroma_server.url,
        "RAG_JOB_LEASE_S": str(LEASE_S),
    }
    ports = [free_port(), free_port()]
    replicas = {port: _replica(port, env, tmp_path) for port in ports}
    front = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config("127.0.0.1", front, [("127.0.0.1", p) for p in ports], "/v1/collections"))
    balancer = start_server("haproxy", haproxy_command(config), front, tmp_path, ready_path="/v1/collections")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{front}", timeout=60) as client:
            for i in range(FILES // 2):
                _upload(client, i)
            killed_job, pid = _running_worker(database_url, time.monotonic() + 120)
            (port,) = [p for p, r in replicas.items() if r.pid == pid]
            os.killpg(pid, signal.SIGKILL)  # mid-job: its chunks half written, its lease left to run out
            replicas[port].process.wait()
            for i in range(FILES // 2, FILES):  # the balancer sends them to the replica that is left
                _upload(client, i)
            replicas[port] = _replica(port, env, tmp_path)
            jobs = _wait_done(client, time.monotonic() + 180)
            documents = client.get("/v1/documents", params={"limit": 1000}).json()
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        statuses = {j["results"][0]["status"] for j in jobs.values()}
        # A job is taken over only from a dead worker: its file is indexed by one worker and reported so,
        # never "failed" as busy under a late but live one (tests/test_job_lease.py).
        reasons = [(j["results"][0].get("filename"), j["results"][0].get("reason")) for j in jobs.values()]
        assert statuses <= {"indexed", "unchanged"}, [r for r in reasons if r[1]]
        assert len(documents["documents"]) == documents["total"] == FILES
        assert sorted(d["source"] for d in documents["documents"]) == sorted(f"report-{i}.txt" for i in range(FILES))
        chunks = sum(d["chunks"] for d in documents["documents"])
        with psycopg.connect(database_url, autocommit=True) as conn:
            attempts = conn.execute("SELECT attempts FROM upload_jobs WHERE id = %s", (killed_job,)).fetchone()[0]
            record = conn.execute("SELECT count(*), count(DISTINCT chunk_id) FROM chunks").fetchone()
            pending = conn.execute("SELECT count(*) FROM documents WHERE state != 'indexed'").fetchone()[0]
        assert attempts >= 2  # the killed replica's job was taken again by another worker
        assert record == (chunks, chunks) and pending == 0
        assert _chroma_count(chroma_server.url) == chunks
    finally:
        balancer.stop()
        for replica in replicas.values():
            replica.stop()


def _wait_done(client: httpx.Client, deadline: float) -> dict[str, dict[str, object]]:
    jobs: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline:
        for i in range(FILES):
            try:
                response = client.get(f"/v1/jobs/job-{i:04d}")
            except httpx.TransportError:
                continue
            if response.status_code == 200:
                jobs[f"job-{i:04d}"] = response.json()
        if len(jobs) == FILES and all(j["state"] in ("done", "failed") for j in jobs.values()):
            return jobs
        time.sleep(0.5)
    raise AssertionError(f"jobs not done in time: {jobs}")


def _chroma_count(url: str) -> int:
    code = (
        "import chromadb, sys; from urllib.parse import urlparse; u = urlparse(sys.argv[1]); "
        "c = chromadb.HttpClient(host=u.hostname, port=u.port); print(c.get_collection('default').count())"
    )
    done = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def test_rag_up_plans_replicas_behind_the_balancer_on_the_api_port(tmp_path: Path) -> None:
    from rag.core.config import Settings
    from rag.deploy.launcher import plan_parts
    from rag.deploy.replicas import with_replicas

    settings = Settings(
        data_dir=tmp_path,
        llm_model_path=tmp_path / "m.gguf",
        llm_server_bin=Path("/bin/true"),
        api_port=8300,
        database_url="postgresql://rag@db/rag",
    )
    parts = {p.name: p for p in with_replicas(plan_parts(settings), settings, 3)}
    assert list(parts)[-5:] == ["chroma", "api-1", "api-2", "api-3", "balancer"]
    assert [parts[f"api-{i}"].port for i in (1, 2, 3)] == [8301, 8302, 8303] and parts["chroma"].port == 8304
    assert parts["api-2"].env == {
        "RAG_DATABASE_URL": "postgresql://rag@db/rag",
        "RAG_CHROMA_MODE": "server",
        "RAG_CHROMA_URL": "http://127.0.0.1:8304",
        "RAG_API_PORT": "8302",
    }
    balancer = parts["balancer"]
    assert balancer.port == 8300 and balancer.health_url == "http://127.0.0.1:8300/health"
    checked = subprocess.run([*balancer.command[:-2], "-c", "-f", balancer.command[-1]], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "server api-3 127.0.0.1:8303 check" in Path(balancer.command[-1]).read_text()
    assert [p.name for p in with_replicas(plan_parts(settings), settings, 1)][-1] == "api"  # as before


def test_one_api_on_postgresql_answers_503_while_the_database_is_away_then_recovers(
    postgres_server: Any, database_url: str, ingest_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    api = _replica(port, {**ingest_env, "RAG_DATABASE_URL": database_url}, tmp_path)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            first = client.post("/v1/documents", files={"files": ("report-1.txt", _text(1), "text/plain")})
            assert first.status_code == 200 and first.json()["results"][0]["status"] == "indexed", first.text
            assert client.get(f"/v1/jobs/{first.json()['job_id']}").json()["state"] == "done"
            postgres_server._stop()  # the session's server, started again below
            try:
                away = client.get("/v1/documents")
                refused = client.post(
                    "/v1/documents",
                    params={"wait": "false", "job_id": "retried-0001"},
                    files={"files": ("report-3.txt", _text(3), "text/plain")},
                )
            finally:
                postgres_server.ensure_postgres_running()
            for response in (away, refused):
                assert response.status_code == 503 and response.headers["retry-after"], response.text
                assert response.json()["error"]["code"] == "store_unavailable"
            back = client.get("/v1/documents")  # the same process, connected again
            assert back.status_code == 200 and back.json()["total"] == 1
            # The refused try never reached the database: sent again under its id, it is a new upload, not 409.
            retried = client.post(
                "/v1/documents",
                params={"wait": "false", "job_id": "retried-0001"},
                files={"files": ("report-3.txt", _text(3), "text/plain")},
            )
            assert retried.status_code == 202, retried.text
            queued = client.post(
                "/v1/documents", params={"wait": "false"}, files={"files": ("report-2.txt", _text(2), "text/plain")}
            )
            assert queued.status_code == 202
            deadline = time.monotonic() + 120
            while client.get(f"/v1/jobs/{queued.json()['job_id']}").json()["state"] != "done":
                assert time.monotonic() < deadline
                time.sleep(0.5)
            while client.get("/v1/jobs/retried-0001").json()["state"] != "done":
                assert time.monotonic() < deadline
                time.sleep(0.5)
            assert client.get("/v1/documents").json()["total"] == 3
    finally:
        api.stop()
