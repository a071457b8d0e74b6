"""Documents, upload jobs and collections: `/v1/documents`, `/v1/jobs/{id}`, `/v1/collections`."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ingest.job_queue import JobQueue
from ingest.jobs import Job, JobRegistry
from ingest.pipeline import FileResult, IngestPipeline, SourceFile
from rag.api.deps import AccessDep, CatalogDep, JobQueueDep, JobsDep, PipelineDep, SettingsDep
from rag.api.errors import error_response
from rag.api.uploads import ReceivedForm, check_source, receive_multipart, upload_names
from rag.core.errors import BackendUnavailable, Conflict, InvalidRequest, NotFound, RagError
from rag.store.catalog import State

router = APIRouter()

CollectionQuery = Annotated[str | None, Query(description="Default: RAG_COLLECTION.")]


class FileOutcome(BaseModel):
    """One uploaded file: indexed, unchanged (the same content was there), failed (with its reason) or deleted."""

    filename: str
    document_id: str | None
    status: Literal["indexed", "unchanged", "failed", "deleted"]
    reason: str | None
    chunks: int
    warnings: list[str]


class UploadResult(BaseModel):
    """An upload's answer: its job and, once indexed (`wait`), a result per file (none yet with 202)."""

    job_id: str
    collection: str
    results: list[FileOutcome]


class JobProgress(BaseModel):
    """An upload's progress; `error` only when the job failed."""

    job_id: str
    collection: str
    state: Literal["running", "done", "failed", "deleted", "cancelled"]
    phase: Literal["receiving", "running", "done", "failed", "deleted", "cancelled"]
    files_total: int
    files_done: int
    chunks_done: int
    current_file: str | None
    current_page: str | None = None  # "3 of 25": the page of the current file that OCR reads
    results: list[FileOutcome]
    seconds: float
    cancelling: bool = False  # a cancel was asked for: the job stops at its worker's next step
    error: Annotated[dict[str, Any] | None, Field(exclude_if=lambda v: v is None)] = None


class DocumentName(BaseModel):
    source: str
    source_key: str


class Document(BaseModel):
    """A document (one content) of a collection; `names` every name it was uploaded under, its own first."""

    id: str
    source: str
    source_key: str
    collection: str
    size: int
    chunks: int
    pages: int | None
    state: State
    error: str | None
    created_at: str | None
    indexed_at: str | None
    names: list[DocumentName]


class DocumentList(BaseModel):
    documents: list[Document]
    total: int
    failed: int
    offset: int
    limit: int


class CollectionEntry(BaseModel):
    name: str
    documents: int
    failed: int


class KeyScope(BaseModel):
    """What a scoped key opens (`collections`: null for every one) and whether it is read-only."""

    collections: list[str] | None
    read_only: bool


class CollectionList(BaseModel):
    collections: list[CollectionEntry]
    key: Annotated[KeyScope | None, Field(exclude_if=lambda v: v is None)] = None  # for a scoped key only


REMOVED: dict[int | str, dict[str, Any]] = {204: {"description": "Removed: no body."}}


@router.post(
    "/documents",
    response_model=UploadResult,
    responses={202: {"model": UploadResult, "description": "Received (`wait=false`): poll the job."}},
)
async def upload_documents(
    request: Request,
    response: Response,
    settings: SettingsDep,
    pipeline: PipelineDep,
    jobs: JobsDep,
    queue: JobQueueDep,
    access: AccessDep,
    collection: CollectionQuery = None,
    job_id: Annotated[
        str | None, Query(description="Your own id for this upload, to poll /v1/jobs/{id} meanwhile.")
    ] = None,
    wait: Annotated[bool, Query(description="false: answer 202 once the files are received; poll the job.")] = True,
) -> UploadResult | JSONResponse:
    """Upload one or many files (multipart field `files`); each is indexed, unchanged or failed.

    One file: its own error status (413, 415, 422) when it fails. Several: 200 with a result per file.
    """
    job = jobs.create(access.writable(collection, settings), job_id)
    if (task := asyncio.current_task()) is not None:
        jobs.runs(job, task)  # a cancel of the job stops this request
    uploads = settings.data_dir / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="upload-", dir=uploads))
    handed_over = False
    try:
        form = await receive_multipart(
            request.stream(),
            request.headers.get("content-type"),
            request.headers.get("content-length"),
            directory,
            settings.max_upload_bytes,
        )
        job.collection = access.writable(form.field("collection") or job.collection, settings)
        await asyncio.to_thread(pipeline.catalog.check_room, job.collection, settings.max_collections)
        files = _source_files(form)
        job.files_total, job.state = len(files), "running"
        if not wait:
            handed_over = await _hand_over(pipeline, jobs, queue, job, files, directory)
            response.status_code = 202
            return UploadResult(job_id=job.id, collection=job.collection, results=[])
        results = await _run_here(pipeline, queue, job, files)
    except asyncio.CancelledError:
        return _interrupted(job)
    except BaseException as exc:
        if job.finished is None:
            job.fail(
                exc.to_dict()
                if isinstance(exc, RagError)
                else {"code": "internal_error", "message": "the upload stopped"}
            )
        if queue is not None and isinstance(exc, BackendUnavailable):
            # With the jobs in the database, the database alone says whether this try arrived: a retry
            # under the same id is then 409 there, or taken as new (kept here, it was 409 and lost).
            jobs.forget(job.id)
        raise
    finally:
        if not handed_over:
            shutil.rmtree(directory, ignore_errors=True)
    if len(results) == 1 and results[0].error is not None:
        raise results[0].error
    outcomes = [FileOutcome.model_validate(r.to_api()) for r in results]
    return UploadResult(job_id=job.id, collection=job.collection, results=outcomes)


async def _hand_over(
    pipeline: IngestPipeline,
    jobs: JobRegistry,
    queue: JobQueue | None,
    job: Job,
    files: list[SourceFile],
    directory: Path,
) -> bool:
    """Leave a `wait=false` upload to a worker: any replica's (in the database), or a task of this process
    (which then owns `directory`: True)."""
    if queue is not None:
        await asyncio.to_thread(queue.add, job, files, run_here=False)
        return False
    jobs.keep_task(asyncio.create_task(_run_job(pipeline, job, files, directory)), job)
    return True


async def _run_here(
    pipeline: IngestPipeline, queue: JobQueue | None, job: Job, files: list[SourceFile]
) -> list[FileResult]:
    """Index the upload within its request (in the database as a job this replica holds, when there is one)."""
    if queue is None:
        return await _run_job(pipeline, job, files, directory=None)
    await asyncio.to_thread(queue.add, job, files, run_here=True)
    results: list[FileResult] = []
    async with queue.holding(job, again_when_away=False):
        results = await _run_job(pipeline, job, files, directory=None)
    if job.state == "cancelled":  # from another replica: the holder stopped the run
        raise _cancelled(job)
    return results


def _interrupted(job: Job) -> JSONResponse:
    """The request was cancelled: by a cancel of its job (409), or by the server stopping past its grace
    (503). Its client hears why in JSON (the upload was rolled back), not the server's bare-text 500."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    if job.cancelling:
        if job.finished is None:
            job.cancelled()
        return error_response(_cancelled(job))
    stopped = BackendUnavailable(
        "the API is shutting down: this upload was rolled back; send it again once it is back", retry_after=10
    )
    if job.finished is None:
        job.fail(stopped.to_dict())
    return error_response(stopped)


def _cancelled(job: Job) -> Conflict:
    return Conflict(
        f"upload job {job.id} was cancelled: the {job.files_done} file(s) done before stay indexed, the one "
        "being read was rolled back"
    )


def _source_files(form: ReceivedForm) -> list[SourceFile]:
    """The received files with their sources: the client's `sources` (one per file, in order), else
    the file name (or a server id for a name that is not a plain file name)."""
    sources = form.fields.get("sources", [])
    if sources and len(sources) != len(form.files):
        raise InvalidRequest(f"{len(sources)} 'sources' values for {len(form.files)} files")
    files = []
    for i, received in enumerate(form.files):
        source, name = upload_names(received.filename)
        files.append(SourceFile(received.path, check_source(sources[i]) if sources else source, name))
    return files


async def _run_job(
    pipeline: IngestPipeline, job: Job, files: list[SourceFile], directory: Path | None
) -> list[FileResult]:
    try:
        results = await pipeline.run(files, job.collection, progress=job)
    except RagError as exc:
        job.fail(exc.to_dict())
        raise
    except asyncio.CancelledError:
        if job.cancelling:
            job.cancelled()  # asked for by its user; otherwise the server is stopping
        else:
            job.fail({"code": "internal_error", "message": "the upload stopped; see the API log"})
        raise
    except BaseException:
        job.fail({"code": "internal_error", "message": "the upload stopped; see the API log"})
        raise
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
    job.finish(results)
    return results


@router.get("/jobs/{job_id}")
async def get_job(job_id: str, jobs: JobsDep, queue: JobQueueDep, access: AccessDep) -> JobProgress:
    """An upload's progress: files done, chunks done, the current file; its results once done."""
    if queue is not None:  # from the database: whichever replica runs the job stored it there
        collection, progress = await asyncio.to_thread(queue.progress, job_id)
        if not access.allows(collection):
            raise NotFound(f"no job {job_id[:100]!r}")
        return JobProgress.model_validate(progress)
    job = jobs.get(job_id)
    if not access.allows(job.collection):
        raise NotFound(f"no job {job_id[:100]!r}")
    return JobProgress.model_validate(job.to_api())


@router.delete("/jobs/{job_id}", status_code=202)
async def cancel_job(
    job_id: str, jobs: JobsDep, queue: JobQueueDep, access: AccessDep, settings: SettingsDep
) -> JobProgress:
    """Cancel an upload job, from any replica: the files done before stay indexed, the one being read
    is rolled back, the rest are not read. `state` is `cancelled` once it stopped, else `cancelling`
    is true until its worker's next step (poll the job). An ended job is a 409."""
    if queue is not None:
        progress = await asyncio.to_thread(queue.cancel, job_id, lambda name: access.writable(name, settings))
        return JobProgress.model_validate(progress)
    job = jobs.get(job_id)
    if not access.allows(job.collection):
        raise NotFound(f"no job {job_id[:100]!r}")
    access.writable(job.collection, settings)
    await jobs.cancel(job)
    return JobProgress.model_validate(job.to_api())


@router.get("/documents")
async def list_documents(
    settings: SettingsDep,
    catalog: CatalogDep,
    access: AccessDep,
    collection: CollectionQuery = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    state: Annotated[
        str,
        Query(
            pattern="^(pending|indexed|failed|deleting)$",
            description="indexed: the documents; failed: the files that failed.",
        ),
    ] = "indexed",
) -> DocumentList:
    """The documents of a collection (one per content, its names beneath it), oldest first, a page at a
    time; `failed` counts the failures, listed apart with `state=failed`."""
    name = access.collection(collection, settings)

    def read() -> dict[str, Any]:
        records = catalog.documents(name, offset, limit, cast(State, state))
        names = catalog.names_of(name, [r.doc_id for r in records])
        total, failed = catalog.count_in(name, cast(State, state)), catalog.count_in(name, "failed")
        if not total and not failed:
            access.check_exists(name, settings, (n for n, _ in catalog.collections()))
        return {"documents": [r.to_api(names.get(r.doc_id)) for r in records], "total": total, "failed": failed}

    return DocumentList.model_validate({**await asyncio.to_thread(read), "offset": offset, "limit": limit})


@router.get("/documents/{doc_id}")
async def get_document(
    doc_id: str, settings: SettingsDep, catalog: CatalogDep, access: AccessDep, collection: CollectionQuery = None
) -> Document:
    name = access.collection(collection, settings)
    record = await asyncio.to_thread(catalog.get, name, doc_id)
    if record is None:
        raise NotFound(f"no document {doc_id} in collection {name}")
    names = await asyncio.to_thread(catalog.names_of, name, [doc_id])
    return Document.model_validate(record.to_api(names.get(doc_id)))


@router.delete("/documents/{doc_id}", status_code=204, responses=REMOVED)
async def delete_document(
    doc_id: str,
    settings: SettingsDep,
    pipeline: PipelineDep,
    access: AccessDep,
    collection: CollectionQuery = None,
    source: Annotated[str | None, Query(description="Remove only this name (`source_key`) of the document.")] = None,
) -> Response:
    """Remove a document: out of search at once, then every chunk from Chroma and the lexical index.

    With `source`, only that name goes when the same content is also known under another (whose chunks stay).
    """
    name = access.writable(collection, settings)
    if await pipeline.delete(name, doc_id, source) is None:
        raise NotFound(f"no document {doc_id} in collection {name}")
    return Response(status_code=204)


@router.delete("/collections/{name}", status_code=204, responses=REMOVED)
async def delete_collection(name: str, settings: SettingsDep, pipeline: PipelineDep, access: AccessDep) -> Response:
    """Remove a collection: every document (uploads being indexed into it stop), its chunks, its index."""
    collection = access.writable(name, settings)  # a key that does not open it finds no such collection
    if not await pipeline.delete_collection(collection):
        raise NotFound(f"no collection {collection[:100]!r}")
    return Response(status_code=204)


@router.get("/collections")
async def list_collections(catalog: CatalogDep, access: AccessDep) -> CollectionList:
    """Every collection with a row (those the key opens): its documents (indexed contents) and its failed
    files. For a scoped key, `key` says what it opens (`collections`: null for every one) and whether it
    is read-only (the page shows its collections and hides what it may not do)."""
    counts = await asyncio.to_thread(catalog.counts)
    shown = [
        CollectionEntry(name=name, documents=c.documents, failed=c.failed)
        for name, c in counts.items()
        if access.allows(name)
    ]
    if access.key is None:
        return CollectionList(collections=shown)
    scope = access.key.collections
    key = KeyScope(collections=list(scope) if scope is not None else None, read_only=access.read_only)
    return CollectionList(collections=shown, key=key)
