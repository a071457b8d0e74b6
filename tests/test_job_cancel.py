"""`DELETE /v1/jobs/{id}` stops an upload job: the files done before stay indexed, the one being read is
rolled back, the rest are not read. In one API process, and on PostgreSQL from another replica than the
one whose worker runs the job (real embedding server, PostgreSQL and Chroma server)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest.jobs import Job, JobRegistry
from rag.core.errors import Conflict
from tests.servers import Server, free_port, start_api
from tests.test_replicas import _replica, _text

pytestmark = pytest.mark.integration

FILES = 30


def _upload(client: httpx.Client, job_id: str, files: range) -> None:
    response = client.post(
        "/v1/documents",
        params={"wait": "false", "job_id": job_id},
        files=[("files", (f"report-{i}.txt", _text(i), "text/plain")) for i in files],
    )
    assert response.status_code == 202, response.text


def _job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _until(client: httpx.Client, job_id: str, done: Any, timeout_s: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not done(job := _job(client, job_id)):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def _states(client: httpx.Client) -> Counter[str]:
    listed = client.get("/v1/documents", params={"limit": 1000}).json()
    return Counter(d["state"] for d in listed["documents"])


def _check_cancelled(client: httpx.Client, job: dict[str, Any]) -> None:
    """Only the files the job finished are indexed; nothing is left half written."""
    assert job["state"] == "cancelled" and not job["cancelling"], job
    assert 1 <= job["files_done"] < FILES, job
    assert [r["status"] for r in job["results"]] == ["indexed"] * job["files_done"]
    states = _states(client)
    assert states["indexed"] == job["files_done"], states
    assert states["pending"] == 0, states
    again = client.delete(f"/v1/jobs/{job['job_id']}")
    assert again.status_code == 409, again.text


def test_an_ended_job_cannot_be_cancelled() -> None:
    import asyncio

    job = Job("job-00001", "default")
    job.finish([])
    with pytest.raises(Conflict):
        asyncio.run(JobRegistry().cancel(job))


@pytest.mark.timeout(300)
def test_a_background_job_cancelled_keeps_the_files_done_and_reads_no_more(
    ingest_env: dict[str, str], tmp_path: Path
) -> None:
    api = start_api(tmp_path, ingest_env, ready_path="/v1/collections")
    try:
        with httpx.Client(base_url=api.url, timeout=120) as client:
            _upload(client, "job-cancel-1", range(FILES))
            _until(client, "job-cancel-1", lambda j: j["files_done"] >= 1)
            cancelled = client.delete("/v1/jobs/job-cancel-1")
            assert cancelled.status_code == 202, cancelled.text
            job = _until(client, "job-cancel-1", lambda j: j["state"] != "running", timeout_s=30)
            _check_cancelled(client, job)
    finally:
        api.stop()


@pytest.mark.timeout(400)
def test_a_job_is_cancelled_from_another_replica_than_the_one_running_it(
    chroma_server: Server,
    database_url: str,
    ingest_env: dict[str, str],
    tmp_path: Path,
) -> None:
    env = {
        **ingest_env,
        "RAG_DATABASE_URL": database_url,
        "RAG_CHROMA_MODE": "server",
        "RAG_CHROMA_URL": chroma_server.url,
    }
    replicas = [_replica(free_port(), env, tmp_path) for _ in range(2)]
    try:
        one, other = (httpx.Client(base_url=r.url, timeout=120) for r in replicas)
        with one, other:
            _upload(one, "job-cancel-2", range(FILES))
            _until(other, "job-cancel-2", lambda j: j["files_done"] >= 1)
            asked = other.delete("/v1/jobs/job-cancel-2")
            assert asked.status_code == 202, asked.text
            assert asked.json()["cancelling"] or asked.json()["state"] == "cancelled", asked.json()
            job = _until(one, "job-cancel-2", lambda j: j["state"] != "running", timeout_s=30)
            _check_cancelled(one, job)
    finally:
        for replica in replicas:
            replica.stop()


@pytest.mark.timeout(400)
def test_a_queued_job_on_postgresql_is_cancelled_at_once_and_the_running_one_goes_on(
    database_url: str, ingest_env: dict[str, str], tmp_path: Path
) -> None:
    api = _replica(free_port(), {**ingest_env, "RAG_DATABASE_URL": database_url}, tmp_path)
    try:
        with httpx.Client(base_url=api.url, timeout=120) as client:
            _upload(client, "job-running", range(20))
            _until(client, "job-running", lambda j: j["files_done"] >= 1)
            _upload(client, "job-queued", range(100, 104))  # behind the running one: this replica's one worker
            asked = client.delete("/v1/jobs/job-queued")
            assert asked.status_code == 202, asked.text
            assert (asked.json()["state"], asked.json()["files_done"]) == ("cancelled", 0)
            first = _until(client, "job-running", lambda j: j["state"] != "running")
            assert first["state"] == "done" and first["files_done"] == 20, first
            assert _job(client, "job-queued")["state"] == "cancelled"
            assert _states(client)["indexed"] == 20
    finally:
        api.stop()
