"""The owner lease across a PostgreSQL restart (a real server, stopped and started again): its advisory lock
died with the server's sessions, and the replica takes it again as soon as the server is back, without
waiting for its worker's next job. If another process holds it by then, the replica stops working under it,
saying why, instead of running on without a lease."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.job_queue import JobQueue, run_queued
from ingest.jobs import Job
from ingest.pipeline import SourceFile
from rag.core.errors import LeaseLost
from rag.store.postgres import _OWNER_LOCKS, PgOwnerLease, live_owners

BACK_WITHIN_S = 30.0  # once PostgreSQL answers, the lease is held again well before this


def _restart(server: Any) -> None:
    server._stop()
    server.ensure_postgres_running()


def _until(check: Callable[[], bool], limit_s: float = BACK_WITHIN_S) -> bool:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_the_owner_lease_is_held_again_once_postgresql_is_back(postgres_server: Any, database_url: str) -> None:
    lease = PgOwnerLease(database_url)
    try:
        assert live_owners(database_url) == 1
        _restart(postgres_server)
        # No worker calls keep() here (a replica in the middle of a long job does not either).
        assert _until(lambda: live_owners(database_url) == 1), "the lease was not taken again"
        other = PgOwnerLease(database_url)
        try:
            assert other.is_live(lease.token)
        finally:
            other.release()
        assert lease.lost is None
    finally:
        lease.release()


def test_a_lease_another_process_holds_after_the_restart_is_lost_and_the_worker_stops(
    postgres_server: Any, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While the server was away the lock was free; another session took it before this replica came back:
    keep() says the lease is lost (and why, in the log), and the replica's worker takes no more jobs."""
    lease = PgOwnerLease(database_url, keep_s=3600)  # its keeper waits: the test takes the lock first
    queue = JobQueue(database_url, lease.token, 2.0)
    try:
        _restart(postgres_server)
        with psycopg.connect(database_url, autocommit=True) as thief:
            thief.execute("SELECT pg_advisory_lock(%s, %s)", (_OWNER_LOCKS, lease._id))
            with caplog.at_level(logging.ERROR), pytest.raises(LeaseLost, match="another process holds it"):
                lease.keep()
            assert lease.lost is not None and "another process holds it" in lease.lost
            assert any("owner lease" in r.getMessage() and r.levelno >= logging.ERROR for r in caplog.records)
            with pytest.raises(LeaseLost):
                lease.keep()  # lost for good: it is not taken again behind the other's back

            path = tmp_path / "a.txt"
            path.write_text("The harbour master inspected the lighthouse on Tuesday.")
            queue.add(Job("job-1", "default", state="queued"), [SourceFile(path, "a.txt", "a.txt")], run_here=False)
            worker = run_queued(queue, pipeline=None, directory=tmp_path / "uploads", keep=lease.keep, poll_s=0.1)  # type: ignore[arg-type]  # never reaches a run
            asyncio.run(asyncio.wait_for(worker, BACK_WITHIN_S))  # the worker ends instead of taking jobs
            with psycopg.connect(database_url, autocommit=True) as conn:
                row = conn.execute("SELECT state, worker FROM upload_jobs WHERE id = 'job-1'").fetchone()
            assert row == ("queued", None)
    finally:
        queue.close()
        lease.release()


def test_a_process_whose_lease_is_lost_claims_no_document(
    database_url: str, isolated_env: Path, tmp_path: Path
) -> None:
    """An upload on a replica whose lease is lost fails with LeaseLost (503: another replica takes it), and
    the catalog holds no row claimed under the lost lease."""
    from ingest.pipeline import IngestPipeline
    from rag.core.config import Settings
    from rag.store.catalog import DocumentCatalog
    from rag.store.chroma_vectors import ChunkStore
    from rag.store.chunk_record import LexicalIndex
    from tests.ingest_helpers import HashEmbedder, paragraph_chunks

    settings = Settings(data_dir=isolated_env)
    lease = PgOwnerLease(database_url, keep_s=3600)
    catalog = DocumentCatalog(isolated_env / "catalog.sqlite")
    pipeline = IngestPipeline(
        settings,
        HashEmbedder(),  # type: ignore[arg-type]
        ChunkStore.open(settings),
        LexicalIndex(isolated_env / "lexical.sqlite"),
        catalog,
        lease,  # type: ignore[arg-type]  # the same calls
        prepare=paragraph_chunks,
    )
    path = tmp_path / "a.txt"
    path.write_text("The harbour master inspected the lighthouse on Tuesday.")
    try:
        lease.lost = "the owner lease could not be taken again after PostgreSQL came back: another process holds it"
        with pytest.raises(LeaseLost) as caught:
            asyncio.run(pipeline.run([SourceFile(path, "a.txt", "a.txt")], "default"))
        assert caught.value.status == 503 and caught.value.code == "lease_lost"
        assert catalog.list("default", 0, 10) == []
    finally:
        lease.release()
