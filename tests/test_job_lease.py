"""An upload job's lease on PostgreSQL: another worker takes a job over only once its worker's process is
gone, not while that worker is alive but late to renew (a loaded machine): two workers on one job would
both index its file, and the second would report it "failed" (busy) although the first indexed it. A job
its live worker could not queue again while the database was away, that worker queues again itself. A live
worker whose job makes no progress (a step hung, its heartbeat still renewing) gives the job up itself: it is
queued again, and failed with the reason once it has stalled on every attempt; a worker whose job another
worker took over stops running it."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.job_queue import JobQueue
from ingest.jobs import Job
from ingest.pipeline import SourceFile
from rag.core.errors import Conflict, JobStalled, StoreUnavailable
from rag.store.postgres import PgOwnerLease

LEASE_S = 1.0


STALL_S = 3.0  # no progress for this long: the worker gives its job up
RUN_LIMIT_S = 60.0  # a test run that has not ended by then hangs (the behaviour under test is broken)


def _worker(url: str, stall_s: float = 900.0, max_attempts: int = 3) -> tuple[PgOwnerLease, JobQueue]:
    """A replica's owner lease and its job queue, as the API opens them (the worker is the lease's token)."""
    lease = PgOwnerLease(url)
    return lease, JobQueue(url, lease.token, LEASE_S, stall_s=stall_s, max_attempts=max_attempts)


def _row(url: str, job_id: str) -> tuple[Any, ...]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT state, worker, attempts, progress::jsonb FROM upload_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return tuple(row)


def _run_hung(queue: JobQueue, job: Job) -> BaseException | None:
    """Hold `job` while its run is stuck in a step that never returns; what the holding raised."""

    async def hung() -> None:
        async with queue.holding(job):
            job.file_started(SourceFile(Path("stuck.pdf"), "stuck.pdf", "stuck.pdf"))
            await asyncio.Event().wait()  # a parser that never returns: only the heartbeat still runs

    try:
        asyncio.run(asyncio.wait_for(hung(), RUN_LIMIT_S))
    except TimeoutError:
        raise AssertionError(f"the hung run still held its job after {RUN_LIMIT_S:g} s") from None
    except Exception as exc:
        return exc
    return None


def _dies(lease: PgOwnerLease) -> None:
    """The process ends as kill -9 ends it: its connections close (its advisory lock goes), its row stays,
    and its keeper thread no longer takes the lock again."""
    lease._released.set()
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


def test_a_job_whose_progress_stops_is_given_up_by_its_live_worker_then_failed_after_its_attempts(
    database_url: str, tmp_path: Path
) -> None:
    """The worker's process lives and its heartbeat renews, but its run is stuck: after STALL_S without
    progress the worker stops the run and queues the job again (the attempt counted); another worker, or
    the same, takes it; on its last attempt it fails, saying why."""
    lease, queue = _worker(database_url, stall_s=STALL_S, max_attempts=2)
    try:
        _queued(queue, tmp_path, "job-5")
        first = queue.take()
        assert first is not None
        stopped = _run_hung(queue, first[0])
        assert isinstance(stopped, JobStalled), stopped
        state, worker, attempts, _ = _row(database_url, "job-5")
        assert (state, worker, attempts) == ("queued", None, 1)

        second = queue.take()
        assert second is not None and second[0].id == "job-5"
        assert isinstance(_run_hung(queue, second[0]), JobStalled)
        state, worker, attempts, progress = _row(database_url, "job-5")
        assert (state, attempts) == ("failed", 2)
        assert progress["error"]["code"] == "job_stalled"
        assert "no progress" in progress["error"]["message"] and "RAG_JOB_STALL_S" in progress["error"]["message"]
        assert "stuck.pdf" in progress["error"]["message"]
        assert queue.take() is None
    finally:
        queue.close()
        lease.release()


def test_a_job_that_keeps_progressing_is_not_given_up(database_url: str, tmp_path: Path) -> None:
    """A run longer than STALL_S whose progress advances (chunks stored) runs to its end on its first attempt."""
    lease, queue = _worker(database_url, stall_s=STALL_S, max_attempts=1)
    try:
        _queued(queue, tmp_path, "job-6")
        taken = queue.take()
        assert taken is not None
        job = taken[0]

        async def progressing() -> None:
            async with queue.holding(job):
                for _ in range(int(STALL_S * 3 / 0.1)):
                    await asyncio.sleep(0.1)
                    job.chunks_stored(1)
                job.finish([])

        asyncio.run(progressing())
        assert _row(database_url, "job-6")[:3] == ("done", lease.token, 1)
    finally:
        queue.close()
        lease.release()


def test_a_worker_whose_job_was_taken_over_stops_running_it(database_url: str, tmp_path: Path) -> None:
    """Another worker took the job (this one looked gone: PostgreSQL away, its owner lease dropped): this
    worker's heartbeat finds the job no longer its own and stops its run, storing nothing over the other's."""
    lease, queue = _worker(database_url)
    try:
        _queued(queue, tmp_path, "job-7")
        taken = queue.take()
        assert taken is not None
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("UPDATE upload_jobs SET worker = 'another-worker', attempts = 2 WHERE id = 'job-7'")
        stopped = _run_hung(queue, taken[0])
        assert isinstance(stopped, Conflict) and "another worker" in stopped.message, stopped
        assert _row(database_url, "job-7")[:3] == ("running", "another-worker", 2)
    finally:
        queue.close()
        lease.release()


def test_a_stalled_upload_is_run_again_and_nothing_is_indexed_twice(
    database_url: str, isolated_env: Path, tmp_path: Path
) -> None:
    """A real pipeline: on its first attempt one file's loader never returns while the two others are
    indexed. The worker gives the job up, rolling that file back; the second attempt finds the two done
    files `unchanged` and indexes the third; every document's chunks are stored and embedded once."""
    from ingest.job_queue import run_taken
    from rag.core.config import Settings
    from tests.ingest_helpers import HashEmbedder, census, open_pipeline, paragraph_chunks

    released = threading.Event()
    hung: list[str] = []

    def prepare(data: bytes, file: SourceFile, doc_id: str) -> Any:
        if file.name == "stuck.txt" and not hung:
            hung.append(doc_id)
            released.wait(RUN_LIMIT_S * 2)  # a loader that never returns (freed when the test ends)
        return paragraph_chunks(data, file, doc_id)

    embedder = HashEmbedder()
    pipeline = open_pipeline(Settings(data_dir=isolated_env, embed_batch=4), embedder, prepare)
    queue = JobQueue(database_url, pipeline.lease.token, LEASE_S, stall_s=STALL_S, max_attempts=2)
    texts = {name: [f"{name} paragraph {i} about the harbour." for i in range(3)] for name in ("a", "stuck", "c")}
    paths = []
    for name, paragraphs in texts.items():
        path = tmp_path / f"{name}.txt"
        path.write_text("\n\n".join(paragraphs))
        paths.append(SourceFile(path, path.name, path.name))
    try:
        queue.add(Job("job-8", "default", state="queued"), paths, run_here=False)

        async def attempt() -> tuple[Job, BaseException | None]:
            taken = await asyncio.to_thread(queue.take)
            assert taken is not None
            job, files = taken
            try:
                await asyncio.wait_for(run_taken(queue, pipeline, job, files, tmp_path / "uploads"), RUN_LIMIT_S)
            except TimeoutError:
                raise AssertionError(f"the stalled run still held its job after {RUN_LIMIT_S:g} s") from None
            except Exception as exc:
                return job, exc
            return job, None

        async def both() -> None:
            first, stopped = await attempt()
            assert isinstance(stopped, JobStalled) and "at stuck.txt:" in stopped.message, stopped
            assert sorted(r.filename for r in first.results if r.status == "indexed") == ["a.txt", "c.txt"]
            assert _row(database_url, "job-8")[:3] == ("queued", None, 1)
            seen = census(isolated_env, "default", pipeline.store)
            assert seen.consistent() and seen.states[hung[0]] == "failed"  # rolled back, not left half written

            second, error = await attempt()
            assert error is None and second.state == "done"
            statuses = {r.filename: r.status for r in second.results}
            assert statuses == {"a.txt": "unchanged", "stuck.txt": "indexed", "c.txt": "unchanged"}
            assert _row(database_url, "job-8")[:3] == ("done", pipeline.lease.token, 2)
            released.set()  # the first attempt's loader thread, abandoned, may end now

        asyncio.run(both())
        seen = census(isolated_env, "default", pipeline.store)
        assert seen.consistent() and sorted(seen.indexed().values()) == [3, 3, 3]
        embedded = [text for call in embedder.calls for text in call]
        assert sorted(embedded) == sorted(text for paragraphs in texts.values() for text in paragraphs)
    finally:
        released.set()
        queue.close()
        pipeline.lease.release()
