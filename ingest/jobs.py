"""Ingestion jobs: the progress of an upload (files done, chunks done, current file), for polling."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from rag.core.errors import Conflict, InvalidRequest, NotFound, RagError

from .pipeline import FileResult, SourceFile

log = logging.getLogger("ingest")

JOB_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


@dataclass
class Job:
    """One upload's progress; it is the pipeline's `Progress` for that run."""

    id: str
    collection: str
    # deleted: every file of the upload was deleted while it was being indexed; cancelled: stopped by a
    # DELETE /v1/jobs/{id} (the files done before stay, the one being read is rolled back).
    state: Literal["receiving", "running", "done", "failed", "deleted", "cancelled"] = "receiving"
    files_total: int = 0
    files_done: int = 0
    chunks_done: int = 0
    current_file: str | None = None
    current_page: str | None = None  # "3 of 25": the page of the current file that OCR is reading
    error: dict[str, Any] | None = None
    results: list[FileResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    finished: float | None = None
    cancelling: bool = False  # a cancel was asked for; the worker stops at its next step
    advanced: float = field(default_factory=time.monotonic)  # when its progress last moved (a stall's clock)
    stalled_at: str | None = None  # where it stood still, once its worker gave it up for that
    opened: list[str] = field(default_factory=list)  # the files begun and not done, in the order begun

    def file_started(self, file: SourceFile) -> None:
        self.current_file, self.current_page = file.name, None
        self.opened.append(file.name)
        self.advanced = time.monotonic()

    def page_read(self, file: SourceFile, n: int, total: int | None) -> None:
        self.current_file, self.current_page = file.name, f"{n} of {total}" if total else str(n)
        self.advanced = time.monotonic()

    def chunks_stored(self, n: int) -> None:
        self.chunks_done += n
        self.advanced = time.monotonic()

    def file_done(self, result: FileResult) -> None:
        self.files_done += 1
        self.results.append(result)
        if result.filename in self.opened:
            self.opened.remove(result.filename)
        self.advanced = time.monotonic()

    def unfinished(self) -> str | None:
        """The files begun and not done ("scan.pdf (page 3 of 40), notes.txt"), None before the first."""
        page = f" (page {self.current_page})" if self.current_page else ""
        return ", ".join(n + (page if n == self.current_file else "") for n in self.opened) or None

    def finish(self, results: list[FileResult]) -> None:
        self.results = results
        gone = bool(results) and all(r.status == "deleted" for r in results)
        self.state, self.current_file, self.finished = "deleted" if gone else "done", None, time.time()

    def fail(self, error: dict[str, Any]) -> None:
        self.error = error
        self.state, self.current_file, self.finished = "failed", None, time.time()

    def cancelled(self) -> None:
        """Stopped by its user: the results are the files done before."""
        self.state, self.current_file, self.current_page, self.finished = "cancelled", None, None, time.time()

    def to_api(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "job_id": self.id,
            "collection": self.collection,
            "state": "running" if self.state == "receiving" else self.state,
            "phase": self.state,
            "files_total": self.files_total,
            "files_done": self.files_done,
            "chunks_done": self.chunks_done,
            "current_file": self.current_file,
            "current_page": self.current_page,
            "results": [r.to_api() for r in self.results],
            "seconds": round((self.finished or time.time()) - self.started, 3),
            "cancelling": self.cancelling and self.finished is None,
        }
        if self.error:
            body["error"] = self.error
        return body


class JobRegistry:
    """The jobs of this process, the newest `keep` of them (finished ones are dropped first)."""

    def __init__(self, keep: int = 1000) -> None:
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._keep = keep
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running: dict[str, asyncio.Task[Any]] = {}  # the task that runs each unfinished job

    def keep_task(self, task: asyncio.Task[Any], job: Job) -> None:
        """Hold a background job's task until it ends (the loop keeps only weak references)."""
        self._tasks.add(task)
        task.add_done_callback(self._done)
        self.runs(job, task)

    def runs(self, job: Job, task: asyncio.Task[Any]) -> None:
        """`task` runs `job` (a background task, or the upload request itself): a cancel stops it."""
        self._running[job.id] = task
        task.add_done_callback(lambda _: self._running.pop(job.id) if self._running.get(job.id) is task else None)

    async def cancel(self, job: Job, wait_s: float = 10.0) -> None:
        """Stop an unfinished job and wait up to `wait_s` for it to roll back what it was writing."""
        if job.finished is not None:
            raise Conflict(f"job {job.id} has ended already ({job.state})")
        job.cancelling = True
        task = self._running.get(job.id)
        if task is None:
            return  # still receiving its files: it stops before it starts
        task.cancel()
        await asyncio.wait([task], timeout=wait_s)

    async def cancel_all(self, grace_s: float = 0.0) -> None:
        """Stop the background jobs (at shutdown), once they had `grace_s` to finish, as a request has:
        each one stopped rolls back its unfinished documents."""
        tasks = list(self._tasks)
        if tasks and grace_s > 0:
            await asyncio.wait(tasks, timeout=grace_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # The job records the failure; an unexpected one also goes to the log, with its traceback.
        if not task.cancelled() and (exc := task.exception()) is not None and not isinstance(exc, RagError):
            log.error("upload job failed", exc_info=exc)

    def create(self, collection: str, job_id: str | None = None) -> Job:
        if job_id is None:
            job_id = uuid.uuid4().hex
        elif not JOB_ID.fullmatch(job_id):
            raise InvalidRequest("job_id must be 8-64 characters of letters, digits, '_' and '-'")
        if job_id in self._jobs:
            raise Conflict(f"job {job_id} exists already")
        job = self._jobs[job_id] = Job(job_id, collection)
        self._trim()
        return job

    def forget(self, job_id: str) -> None:
        """Drop a job this process no longer answers for (the database holds the jobs that arrived)."""
        self._jobs.pop(job_id, None)

    def get(self, job_id: str) -> Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise NotFound(f"no job {job_id}") from None

    def _trim(self) -> None:
        if len(self._jobs) <= self._keep:
            return
        for job_id in [j.id for j in self._jobs.values() if j.finished is not None]:
            del self._jobs[job_id]
            if len(self._jobs) <= self._keep:
                return
