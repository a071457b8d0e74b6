"""An upload job's lease on PostgreSQL: another worker takes a job over only once its worker's process is
gone, not while that worker is alive but late to renew (a loaded machine): two workers on one job would
both index its file, and the second would report it "failed" (busy) although the first indexed it. A job
its live worker could not queue again while the database was away, that worker queues again itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

from ingest.job_queue import JobQueue
from ingest.jobs import Job
from ingest.pipeline import SourceFile
from rag.core.errors import StoreUnavailable
from rag.store.postgres import PgOwnerLease

LEASE_S = 1.0


def _worker(url: str) -> tuple[PgOwnerLease, JobQueue]:
    """A replica's owner lease and its job queue, as the API opens them (the worker is the lease's token)."""
    lease = PgOwnerLease(url)
    return lease, JobQueue(url, lease.token, LEASE_S)


def _dies(lease: PgOwnerLease) -> None:
    """The process ends as kill -9 ends it: its connections close (its advisory lock goes), its row stays."""
    lease._held.close()
    lease._db.close()


def _queued(queue: JobQueue, tmp_path: Path, job_id: str) -> None:
    path = tmp_path / f"{job_id}.txt"
    path.write_text("The harbour master inspected the lighthouse on Tuesday.")
    queue.add(
        Job(job_id, "default", state="queued"), [SourceFile(path, f"{job_id}.txt", f"{job_id}.txt")], run_here=False
    )


def test_a_late_worker_that_is_alive_keeps_its_job(database_url: str, tmp_path: Path) -> None:
    lease_a, queue_a = _worker(database_url)
    lease_b, queue_b = _worker(database_url)
    try:
        _queued(queue_a, tmp_path, "job-1")
        taken = queue_a.take()
        assert taken is not None and taken[0].id == "job-1"
        time.sleep(LEASE_S * 2)  # no renewal: its lease has run out, but its process holds its owner lease
        assert queue_b.take() is None
        assert queue_a.renew(taken[0])  # still this worker's: its heartbeat, late, renews it
    finally:
        for queue, lease in ((queue_a, lease_a), (queue_b, lease_b)):
            queue.close()
            lease.release()


def test_a_job_whose_worker_died_is_taken_once_its_lease_runs_out(database_url: str, tmp_path: Path) -> None:
    lease_a, queue_a = _worker(database_url)
    lease_b, queue_b = _worker(database_url)
    try:
        _queued(queue_b, tmp_path, "job-2")
        assert queue_a.take() is not None
        _dies(lease_a)
        assert queue_b.take() is None  # its lease still runs
        time.sleep(LEASE_S * 1.5)
        again = queue_b.take()
        assert again is not None and again[0].id == "job-2"
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute("SELECT worker, attempts FROM upload_jobs WHERE id = 'job-2'").fetchone()
        assert row == (lease_b.token, 2)
    finally:
        queue_a.close()
        queue_b.close()
        lease_b.release()


def test_an_owner_lease_in_another_database_of_the_server_is_not_this_ones(
    database_url: str, postgres_server: object, tmp_path: Path
) -> None:
    """Owner ids start at 1 in every database: a live process on another database of the same server,
    holding the lock of the same id, does not keep a dead worker's job from being taken."""
    from tests.postgres import new_database

    other = PgOwnerLease(new_database(postgres_server))  # id 1 there, its lock held
    lease_a, queue_a = _worker(database_url)  # id 1 here
    lease_b, queue_b = _worker(database_url)
    try:
        _queued(queue_a, tmp_path, "job-3")
        assert queue_a.take() is not None
        _dies(lease_a)
        time.sleep(LEASE_S * 1.5)
        assert queue_b.take() is not None
        assert not lease_b.is_live(lease_a.token)
    finally:
        queue_a.close()
        queue_b.close()
        lease_b.release()
        other.release()


def test_a_job_left_running_while_the_database_was_away_is_queued_again_by_its_own_worker(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL goes away mid-job: the job cannot be queued again then, and its worker, alive, holds it;
    the worker's next take() (the database back) queues it again and takes it."""
    lease, queue = _worker(database_url)
    try:
        _queued(queue, tmp_path, "job-4")
        taken = queue.take()
        assert taken is not None

        def away(job: Job) -> None:
            raise StoreUnavailable("PostgreSQL went away")

        async def run_into_the_outage() -> None:
            async with queue.holding(taken[0]):
                raise StoreUnavailable("PostgreSQL went away")

        monkeypatch.setattr(queue, "give_back", away)
        with pytest.raises(StoreUnavailable):
            asyncio.run(run_into_the_outage())
        monkeypatch.undo()
        time.sleep(LEASE_S * 1.5)
        again = queue.take()
        assert again is not None and again[0].id == "job-4"
    finally:
        queue.close()
        lease.release()
