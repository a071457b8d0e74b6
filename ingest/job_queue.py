"""Upload jobs in PostgreSQL (RAG_DATABASE_URL), taken by any replica's worker.

An upload's files go into the database with its job row, in one transaction, before the API answers;
a worker takes the oldest queued job with `SELECT ... FOR UPDATE SKIP LOCKED` (two workers never take
one job) and holds it by a lease that its heartbeat renews every third of RAG_JOB_LEASE_S (2 s at most). A replica
killed mid-upload stops renewing, and its owner lease (an advisory lock, rag/store/postgres.py) goes with
its connections: once the lease has run out, another worker takes the job and runs it again from its
first file. A worker whose lease ran out while its process lives (late to renew on a loaded machine)
keeps its job; one that it could not queue again while PostgreSQL was away, its own next take() runs
again (the documents that run had claimed are still its own). Nothing is indexed twice: a document's id is its content's hash, so a file
the dead replica finished is `unchanged`, and one it left half written is pending under an owner lease
that died with it, which the new claim takes over after removing its chunks (ingest/_run.py).

Each heartbeat also stores the job's progress (`Job.to_api()`), so `GET /v1/jobs/{id}` answers from any
replica, and reads whether a replica asked to cancel the job (`DELETE /v1/jobs/{id}`): the worker then
stops it like a shutdown would, keeping the files done. The lease's clock is the database's, not the replicas'.

A worker alive but stuck (a step that never returns, its heartbeat renewing all the while) would hold its job
forever: the heartbeat also watches the job's progress, and a job that stood still for `stall_s`
(RAG_JOB_STALL_S) is given up by its own worker: the run is stopped as a cancel stops it (the files done stay,
the one being read is rolled back), then the job is queued again for any worker, the same included; on its
`max_attempts`-th stall it fails with that reason. A worker whose job another worker took over (this one
looked gone: its owner lease dropped while PostgreSQL was away) stops running it, as does one whose owner
lease is lost (`lost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ingest.jobs import Job
from ingest.pipeline import IngestPipeline, SourceFile
from rag.core.errors import BackendUnavailable, Conflict, JobStalled, LeaseLost, NotFound, RagError
from rag.store.postgres import LIVE_TOKENS, Connection, PgStep, migrate, owners_table, run_script
from rag.store.sqlite import write_transaction

log = logging.getLogger("ingest")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS upload_jobs (
    id          TEXT PRIMARY KEY,
    collection  TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed', 'deleted')),
    progress    TEXT NOT NULL,
    worker      TEXT,
    lease_until DOUBLE PRECISION,
    attempts    INTEGER NOT NULL DEFAULT 0,
    created_at  DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp())
);
CREATE INDEX IF NOT EXISTS upload_jobs_waiting ON upload_jobs (created_at) WHERE state IN ('queued', 'running');
CREATE TABLE IF NOT EXISTS upload_files (
    job_id   TEXT NOT NULL REFERENCES upload_jobs (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    source   TEXT NOT NULL,
    name     TEXT NOT NULL,
    data     BYTEA NOT NULL,
    PRIMARY KEY (job_id, position)
)
"""
_CANCEL = """
ALTER TABLE upload_jobs ADD COLUMN IF NOT EXISTS cancel_requested BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE upload_jobs DROP CONSTRAINT IF EXISTS upload_jobs_state_check;
ALTER TABLE upload_jobs ADD CONSTRAINT upload_jobs_state_check
    CHECK (state IN ('queued', 'running', 'done', 'failed', 'deleted', 'cancelled'))
"""
_STALLS = "ALTER TABLE upload_jobs ADD COLUMN IF NOT EXISTS stalls INTEGER NOT NULL DEFAULT 0"
STEPS: list[PgStep] = [
    ("upload jobs and their files", lambda db: run_script(db, _SCHEMA)),
    ("jobs cancelled from any replica", lambda db: run_script(db, _CANCEL)),
    ("jobs given up when they stall", lambda db: run_script(db, _STALLS)),
]
_NOW = "extract(epoch FROM clock_timestamp())"
# A job's stored view once cancelled without its worker (queued, or its worker gone).
_CANCELLED_PROGRESS = (
    """(progress::jsonb || '{"state": "cancelled", "phase": "cancelled", "cancelling": false}')::text"""
)
CANCEL_POLL_S = 2.0  # a running job's worker looks for a cancel (and renews its lease) at least this often


class JobQueue:
    """The upload jobs of every replica; `worker` names this replica's (its owner lease token)."""

    def __init__(
        self,
        url: str,
        worker: str,
        lease_s: float,
        *,
        stall_s: float = 900.0,
        max_attempts: int = 3,
        lost: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.worker = worker
        self.lease_s = lease_s
        self.stall_s = stall_s
        self.max_attempts = max_attempts
        self._lost = lost  # why this worker's owner lease is lost (None while it holds it)
        self._db = Connection(url, "jobs")
        migrate(self._db, "jobs", STEPS)
        owners_table(self._db)  # take() reads which workers are alive
        self._lock = threading.RLock()  # one connection: a transaction holds it against other threads
        # Jobs this worker stopped running while the database was away (their outcome not stored): its next
        # take() runs them again. Their lease runs out, but this worker, alive, still holds them.
        self._owed: set[str] = set()

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        with self._lock:
            return self._db.execute(sql, params)

    def close(self) -> None:
        self._db.close()

    def add(self, job: Job, files: list[SourceFile], *, run_here: bool) -> None:
        """Store the job and its files' bytes: queued for any worker, or held by this one (`run_here`)."""
        state, worker = ("running", self.worker) if run_here else ("queued", None)
        with write_transaction(self._db, self._lock) as db:  # type: ignore[arg-type]  # takes its calls
            inserted = db.execute(
                f"INSERT INTO upload_jobs (id, collection, state, progress, worker, lease_until, attempts) "
                f"VALUES (?, ?, ?, ?, ?, {_NOW} + ?, ?) ON CONFLICT (id) DO NOTHING",
                (job.id, job.collection, state, json.dumps(job.to_api()), worker, self.lease_s, int(run_here)),
            ).rowcount
            if not inserted:
                raise Conflict(f"job {job.id} exists already")
            for position, file in enumerate(files):
                db.execute(
                    "INSERT INTO upload_files (job_id, position, source, name, data) VALUES (?, ?, ?, ?, ?)",
                    (job.id, position, file.source, file.name, file.path.read_bytes()),
                )

    def take(self) -> tuple[Job, list[tuple[str, str, bytes]]] | None:
        """The oldest job that is queued or whose worker is gone (its lease ran out and its process no longer
        holds its owner lease), now this worker's, with its files. A worker alive but late to renew (a loaded
        machine) keeps its job: taken from it, the job's file would be indexed by both, and the second
        worker would find it busy and report it failed. A job that its user cancelled meanwhile is cancelled
        instead."""
        with write_transaction(self._db, self._lock) as db:  # type: ignore[arg-type]  # takes its calls
            _end_cancelled(db)
        rows: list[Any] = []
        while self._owed and not rows:  # run again here: the documents its run had claimed are still its own
            job_id = min(self._owed)
            rows = self._execute(
                f"UPDATE upload_jobs SET lease_until = {_NOW} + ?, attempts = attempts + 1 "
                "WHERE id = ? AND worker = ? AND state = 'running' RETURNING id, collection, attempts",
                (self.lease_s, job_id, self.worker),
            ).fetchall()
            self._owed.discard(job_id)
        rows = (
            rows
            or self._execute(
                f"UPDATE upload_jobs SET state = 'running', worker = ?, lease_until = {_NOW} + ?, attempts = attempts + 1 "
                "WHERE id = (SELECT id FROM upload_jobs WHERE state = 'queued' OR (state = 'running' AND "
                f"lease_until < {_NOW} AND worker NOT IN ({LIVE_TOKENS})) ORDER BY created_at LIMIT 1 "
                "FOR UPDATE SKIP LOCKED) "
                "RETURNING id, collection, attempts",
                (self.worker, self.lease_s),
            ).fetchall()
        )
        if not rows:
            return None
        job_id, collection, attempts = rows[0]
        if attempts > 1:
            log.warning("job %s: taken again (attempt %d): its worker was gone or gave it up", job_id, attempts)
        files = self._execute(
            "SELECT source, name, data FROM upload_files WHERE job_id = ? ORDER BY position", (job_id,)
        ).fetchall()
        job = Job(job_id, collection, state="running", files_total=len(files))
        return job, [(s, n, bytes(d)) for s, n, d in files]

    def renew(self, job: Job) -> bool:
        """Extend this worker's lease and store the progress; False when the job is no longer ours.
        A cancel asked for on any replica sets `job.cancelling`."""
        rows = self._execute(
            f"UPDATE upload_jobs SET lease_until = {_NOW} + ?, progress = ? WHERE id = ? AND worker = ? "
            "AND state = 'running' RETURNING cancel_requested",
            (self.lease_s, json.dumps(job.to_api()), job.id, self.worker),
        ).fetchall()
        if rows and rows[0][0]:
            job.cancelling = True
        return bool(rows)

    def cancel(self, job_id: str, allowed: Callable[[str], object]) -> dict[str, Any]:
        """Cancel a job from any replica: a queued one at once, a running one at its worker's next
        heartbeat. `allowed` raises unless the caller may write to the job's collection. The job's view."""
        with write_transaction(self._db, self._lock) as db:  # type: ignore[arg-type]  # takes its calls
            row = db.execute("SELECT collection, state FROM upload_jobs WHERE id = ? FOR UPDATE", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"no job {job_id[:100]!r}")
            allowed(row[0])
            if row[1] not in ("queued", "running"):
                raise Conflict(f"job {job_id} has ended already ({row[1]})")
            db.execute(
                "UPDATE upload_jobs SET cancel_requested = true, "
                """progress = (progress::jsonb || '{"cancelling": true}')::text WHERE id = ?""",
                (job_id,),
            )
            _end_cancelled(db)  # a queued one: now; a running one waits for its worker
            (progress,) = db.execute("SELECT progress FROM upload_jobs WHERE id = ?", (job_id,)).fetchone()
        return dict(json.loads(progress))

    def finish(self, job: Job) -> None:
        """Store the outcome; the files' bytes go."""
        self._execute(
            "UPDATE upload_jobs SET state = ?, progress = ?, lease_until = NULL WHERE id = ? AND worker = ?",
            (job.state, json.dumps(job.to_api()), job.id, self.worker),
        )
        if job.state in ("done", "failed", "deleted", "cancelled"):
            self._execute("DELETE FROM upload_files WHERE job_id = ?", (job.id,))

    def give_up(self, job: Job) -> None:
        """A job that stood still for `stall_s`: queued again for any worker, or failed with the reason once it
        has stalled on `max_attempts` attempts."""
        with write_transaction(self._db, self._lock) as db:  # type: ignore[arg-type]  # takes its calls
            row = db.execute(
                "UPDATE upload_jobs SET stalls = stalls + 1 WHERE id = ? AND worker = ? AND state = 'running' "
                "RETURNING stalls",
                (job.id, self.worker),
            ).fetchone()
            if row is None:
                return
            if row[0] < self.max_attempts:
                log.warning("job %s: queued again after it stalled (%d of %d)", job.id, row[0], self.max_attempts)
                db.execute(
                    "UPDATE upload_jobs SET state = 'queued', worker = NULL, lease_until = NULL WHERE id = ?",
                    (job.id,),
                )
                return
            job.fail(self.stalled(job, f" on each of its {row[0]} attempts (RAG_JOB_MAX_ATTEMPTS)").to_dict())
            log.error("job %s failed: %s", job.id, job.error and job.error["message"])
            db.execute(
                "UPDATE upload_jobs SET state = 'failed', progress = ?, lease_until = NULL WHERE id = ?",
                (json.dumps(job.to_api()), job.id),
            )
            db.execute("DELETE FROM upload_files WHERE job_id = ?", (job.id,))

    def stalled(self, job: Job, attempts: str = "") -> JobStalled:
        """The error of a job that stood still for `stall_s`, naming where it stood."""
        where = f" at {job.stalled_at}" if job.stalled_at else ""
        return JobStalled(
            f"the upload made no progress for {self.stall_s:g} s (RAG_JOB_STALL_S){where}{attempts}: "
            "a step hung, and its worker stopped it (the files done before stay indexed)"
        )

    def give_back(self, job: Job) -> None:
        """Queue the job again for any worker (this one stops: a shutdown, or a backend away)."""
        self._execute(
            "UPDATE upload_jobs SET state = 'queued', worker = NULL, lease_until = NULL WHERE id = ? AND worker = ?",
            (job.id, self.worker),
        )

    def progress(self, job_id: str) -> tuple[str, dict[str, Any]]:
        """(collection, the job's API view) as its worker last stored it."""
        row = self._execute("SELECT collection, progress FROM upload_jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id}")
        return row[0], json.loads(row[1])

    # Holding and running.

    @contextlib.asynccontextmanager
    async def holding(self, job: Job, *, again_when_away: bool = True) -> AsyncIterator[None]:
        """Renew the job's lease while the body runs it; store its outcome after, or queue it again when
        the body is cancelled (a shutdown) or, with `again_when_away`, a backend is away. The heartbeat
        stops the body when its user cancels the job, when it stalls (JobStalled: queued again, or with
        `again_when_away` false failed at once), when another worker took it over or this worker's owner
        lease is lost (Conflict, LeaseLost: nothing stored over what the other worker stores)."""
        body = asyncio.current_task()
        inside = True
        stopped: list[str] = []  # why the heartbeat stopped the body

        def stop(why: str) -> None:  # a cancel reaches the body only while it runs the job
            if inside and body is not None:
                stopped.append(why)
                body.cancel()

        job.advanced = time.monotonic()  # a stall's clock starts with the run, not with the upload's receiving
        beat = asyncio.create_task(self._heartbeat(job, stop))
        outcome = "finish"
        ended: RagError | None = None  # raised once the outcome is stored
        try:
            yield
        except asyncio.CancelledError:
            why = stopped[0] if stopped else "cancelled" if job.cancelling else None
            if why is None or body is None or body.uncancel():
                outcome = "give_back"  # a shutdown (a cancel asked for meanwhile waits for the next run)
                raise
            outcome, ended = self._stopped(job, why, again_when_away)
        except BackendUnavailable:
            if again_when_away:
                outcome = "give_back"
            else:
                job.fail({"code": "backend_unavailable", "message": "a backend went away during the upload"})
            raise
        finally:
            inside = False
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            store = {"finish": self.finish, "give_back": self.give_back, "give_up": self.give_up}.get(outcome)
            try:
                if store is not None:
                    await asyncio.to_thread(store, job)
            except BackendUnavailable:  # the database away too: run again here once it answers (take())
                self._owed.add(job.id)
        if ended is not None:
            raise ended

    def _stopped(self, job: Job, why: str, again_when_away: bool) -> tuple[str, RagError | None]:
        """What becomes of a job whose heartbeat stopped its run (`why`): how its outcome is stored, and
        the error its holder raises then."""
        if why == "cancelled":
            job.cancelled()  # asked for by its user: the files done stay, the one being read was rolled back
            return "finish", None
        if why == "stalled":
            stalled = self.stalled(job)
            if again_when_away:
                return "give_up", stalled
            job.fail(stalled.to_dict())
            return "finish", stalled
        if why == "taken":
            return "none", Conflict(f"job {job.id} was taken over by another worker")
        return "give_back", LeaseLost(self._lost() or "the owner lease is lost")

    async def _heartbeat(self, job: Job, stop: Callable[[str], None]) -> None:
        while True:
            await asyncio.sleep(min(self.lease_s / 3, CANCEL_POLL_S))
            try:
                if not await asyncio.to_thread(self.renew, job):
                    log.warning("job %s: another worker took it over; this worker stops running it", job.id)
                    stop("taken")
                    return
            except BackendUnavailable as exc:
                log.warning("job %s: could not renew its lease: %s", job.id, exc.message)
            if job.cancelling:
                log.info("job %s: cancelled by its user", job.id)
                stop("cancelled")
                return
            if (lost := self._lost()) is not None:
                log.error("job %s: stopped, this worker's %s", job.id, lost)
                stop("lost")
                return
            still_s = time.monotonic() - job.advanced
            if still_s > self.stall_s:
                job.stalled_at = job.unfinished()
                log.warning(
                    "job %s: no progress for %.0f s (RAG_JOB_STALL_S=%g)%s; its worker gives it up",
                    job.id,
                    still_s,
                    self.stall_s,
                    f" at {job.stalled_at}" if job.stalled_at else "",
                )
                stop("stalled")
                return


def _end_cancelled(db: Any) -> None:
    """Cancel the jobs a user asked to cancel that no worker runs: queued, or their worker gone."""
    gone = db.execute(
        f"UPDATE upload_jobs SET state = 'cancelled', lease_until = NULL, progress = {_CANCELLED_PROGRESS} "
        f"WHERE cancel_requested AND (state = 'queued' OR (state = 'running' AND lease_until < {_NOW} "
        f"AND worker NOT IN ({LIVE_TOKENS}))) "
        "RETURNING id"
    ).fetchall()
    for (job_id,) in gone:
        db.execute("DELETE FROM upload_files WHERE job_id = ?", (job_id,))


async def run_queued(
    queue: JobQueue,
    pipeline: IngestPipeline,
    directory: Path,
    keep: Callable[[], None] = lambda: None,
    poll_s: float = 0.5,
) -> None:
    """This replica's worker: take jobs one at a time, until shutdown cancels it. `keep` checks the owner
    lease between jobs: a lease lost (another process holds it since PostgreSQL restarted) ends the worker."""
    while True:
        try:
            await asyncio.to_thread(keep)
            taken = await asyncio.to_thread(queue.take)
        except LeaseLost as exc:
            log.error("upload worker stops, taking no more jobs: %s", exc.message)
            return
        except BackendUnavailable as exc:
            log.warning("upload worker: %s", exc.message)
            await asyncio.sleep(max(poll_s, 2.0))
            continue
        if taken is None:
            await asyncio.sleep(poll_s)
            continue
        job, files = taken
        try:
            await run_taken(queue, pipeline, job, files, directory)
        except BackendUnavailable as exc:  # queued again; the next try waits a little
            log.warning("upload job %s waits for a backend: %s", job.id, exc.message)
            await asyncio.sleep(max(poll_s, 2.0))
        except RagError:
            pass  # the job records it


async def run_taken(
    queue: JobQueue, pipeline: IngestPipeline, job: Job, files: list[tuple[str, str, bytes]], directory: Path
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="job-", dir=directory))
    try:
        sources = []
        for position, (source, name, data) in enumerate(files):
            path = folder / f"part-{position:05d}"
            path.write_bytes(data)
            sources.append(SourceFile(path, source, name))
        async with queue.holding(job):
            try:
                results = await pipeline.run(sources, job.collection, progress=job)
            except BackendUnavailable:
                raise  # queued again: it resumes when the backend is back
            except RagError as exc:
                job.fail(exc.to_dict())
                raise
            except Exception:
                log.exception("upload job %s failed", job.id)
                job.fail({"code": "internal_error", "message": "the upload stopped; see the API log"})
                return
            job.finish(results)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
