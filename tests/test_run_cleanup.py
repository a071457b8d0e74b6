"""A run that fails takes its unfinished documents out; when the store is away too (PostgreSQL restarted),
it still unlocks them, or the next run of the same document in this process would wait forever."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ingest._locks import KeyedLocks
from ingest._run import _Doc, _Run
from ingest.pipeline import SourceFile
from rag.core.errors import StoreUnavailable


class _AwayCatalog:
    def get(self, *args: Any) -> None:
        raise StoreUnavailable("PostgreSQL went away")


def test_a_failed_run_unlocks_its_documents_even_when_the_store_is_away(tmp_path: Path) -> None:
    locks = KeyedLocks()
    config: Any = SimpleNamespace(inflight=1, locks=locks, stores=SimpleNamespace(catalog=_AwayCatalog()))
    run = _Run(config, "default", [], progress=None)  # type: ignore[arg-type]
    doc = _Doc(0, SourceFile(tmp_path / "a.txt", "a.txt", "a.txt"), "doc-1")

    async def fail_then_run_again() -> None:
        await locks.acquire(("default", "doc-1"))
        run.claimed[doc.doc_id] = doc
        await run.cleanup()
        await asyncio.wait_for(locks.acquire(("default", "doc-1")), 2)  # the next run takes the lock

    asyncio.run(fail_then_run_again())
    assert run.claimed == {}


class _LandedCatalog:
    """The catalog as a stopped run finds it when its last write (the document made searchable) ran on in
    its thread after the stop and landed."""

    def get(self, collection: str, doc_id: str) -> Any:
        return SimpleNamespace(state="indexed", chunks=3, owner=None)


class _Progress:
    def __init__(self) -> None:
        self.done: list[Any] = []

    def file_done(self, result: Any) -> None:
        self.done.append(result)


def test_a_document_made_searchable_by_a_write_that_landed_after_the_stop_is_reported_done(tmp_path: Path) -> None:
    # A cancelled upload job counted the files it finished, while the database held one more indexed:
    # the stop reached the run during its last write, which the thread still made.
    locks = KeyedLocks()
    config: Any = SimpleNamespace(inflight=1, locks=locks, stores=SimpleNamespace(catalog=_LandedCatalog()))
    file = SourceFile(tmp_path / "a.txt", "a.txt", "a.txt")
    progress = _Progress()
    run = _Run(config, "default", [file], progress=progress)  # type: ignore[arg-type]
    doc = _Doc(0, file, "doc-1")

    async def stopped() -> None:
        await locks.acquire(("default", "doc-1"))
        run.claimed[doc.doc_id] = doc
        await run.cleanup()
        await asyncio.wait_for(locks.acquire(("default", "doc-1")), 2)

    asyncio.run(stopped())
    assert [(r.document_id, r.status, r.chunks) for r in progress.done] == [("doc-1", "indexed", 3)]
    assert run.results[0] is not None and run.results[0].status == "indexed" and run.claimed == {}
