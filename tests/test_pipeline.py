"""The ingestion pipeline: versions, batching, failures, recovery; real Chroma, lexical index and catalog.

Unit tests use a hash embedder and a paragraph splitter in place of the embedding server and the
loaders; the integration tests at the end use the real embedding server, loaders and chunker.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.pipeline import IngestPipeline, SourceFile, document_id
from rag.core.config import Settings
from rag.core.errors import Conflict, EmbedderUnavailable
from rag.store.catalog import DocumentCatalog, OwnerLease
from tests.data import CMRC
from tests.ingest_helpers import HashEmbedder, census, expected_chunks, open_pipeline, paragraph_chunks


@pytest.fixture
def settings(isolated_env: Path) -> Settings:
    return Settings(data_dir=isolated_env, embed_batch=4)


@pytest.fixture
def embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture
def pipeline(settings: Settings, embedder: HashEmbedder) -> IngestPipeline:
    return open_pipeline(settings, embedder, paragraph_chunks)


def write(folder: Path, name: str, paragraphs: list[str] | str) -> SourceFile:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(paragraphs if isinstance(paragraphs, str) else "\n\n".join(paragraphs))
    return SourceFile(path, str(path), name)


def run(pipeline: IngestPipeline, files: list[SourceFile], collection: str = "default"):
    return asyncio.run(pipeline.run(files, collection))


def paras(tag: str, n: int) -> list[str]:
    return [f"{tag} paragraph {i} about topic {tag}-{i}." for i in range(n)]


def test_indexes_files_with_chunks_in_both_stores(pipeline: IngestPipeline, tmp_path: Path, settings: Settings) -> None:
    files = [write(tmp_path / "in", f"f{i}.txt", paras(f"f{i}", i + 1)) for i in range(5)]
    results = run(pipeline, files)
    assert [r.status for r in results] == ["indexed"] * 5
    assert [r.chunks for r in results] == [1, 2, 3, 4, 5]
    assert [r.document_id for r in results] == [document_id(f.path.read_bytes()) for f in files]
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent()
    assert seen.indexed() == {r.document_id: r.chunks for r in results}
    stored = pipeline.store.get("default", [f"{results[2].document_id}:1"])[0]
    assert stored.metadata == {"doc_id": results[2].document_id, "chunk_index": 1, "source": "f2.txt"}


def test_batches_span_documents_and_respect_the_batch_size(
    pipeline: IngestPipeline, embedder: HashEmbedder, tmp_path: Path
) -> None:
    files = [write(tmp_path, f"f{i}.txt", paras(f"f{i}", 3)) for i in range(7)]  # 21 chunks, batches of 4
    run(pipeline, files)
    assert embedder.texts == 21
    assert max(len(c) for c in embedder.calls) == 4
    assert len(embedder.calls) <= 7  # documents share batches: not one request per file


def test_embeds_concurrently_with_bounded_requests_in_flight(settings: Settings, tmp_path: Path) -> None:
    embedder = HashEmbedder(delay_s=0.05)
    pipeline = open_pipeline(settings, embedder, paragraph_chunks, inflight=2)
    run(pipeline, [write(tmp_path, f"f{i}.txt", paras(f"f{i}", 4)) for i in range(6)])
    assert embedder.max_concurrent == 2


def test_identical_content_is_unchanged_and_costs_no_embedding(
    pipeline: IngestPipeline, embedder: HashEmbedder, tmp_path: Path
) -> None:
    file = write(tmp_path, "a.txt", paras("a", 3))
    assert run(pipeline, [file])[0].status == "indexed"
    calls = len(embedder.calls)
    again = run(pipeline, [file, SourceFile(file.path, "elsewhere/a-copy.txt", "a-copy.txt")])
    assert [(r.status, r.chunks) for r in again] == [("unchanged", 3), ("unchanged", 3)]
    assert len(embedder.calls) == calls


def test_the_same_file_twice_in_one_run_is_indexed_once(
    pipeline: IngestPipeline, tmp_path: Path, settings: Settings
) -> None:
    file = write(tmp_path, "a.txt", paras("a", 2))
    results = run(pipeline, [file, file])
    assert [r.status for r in results] == ["indexed", "unchanged"]
    assert census(settings.data_dir, "default", pipeline.store).indexed() == {results[0].document_id: 2}


def test_a_new_version_replaces_the_old_one(pipeline: IngestPipeline, tmp_path: Path, settings: Settings) -> None:
    v1 = write(tmp_path, "doc.txt", paras("v1", 3))
    old = run(pipeline, [v1])[0].document_id
    v2 = write(tmp_path, "doc.txt", paras("v2", 2))
    new = run(pipeline, [v2])[0].document_id
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent()
    assert seen.indexed() == {new: 2}
    assert old not in seen.states
    assert [r.doc_id for r in pipeline.catalog.by_source("default", v2.source)] == [new]


def test_switching_back_to_an_old_content_keeps_one_version(
    pipeline: IngestPipeline, tmp_path: Path, settings: Settings
) -> None:
    a = write(tmp_path / "x", "a.txt", paras("twin", 2))
    b = write(tmp_path / "x", "b.txt", paras("b", 1))
    run(pipeline, [a, b])
    b_now = write(tmp_path / "x", "b.txt", paras("twin", 2))  # b.txt now has a.txt's content
    result = run(pipeline, [b_now])[0]
    assert result.status == "unchanged"
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent() and list(seen.indexed()) == [result.document_id]


def test_a_failing_file_is_reported_and_the_run_goes_on(
    pipeline: IngestPipeline, tmp_path: Path, settings: Settings
) -> None:
    files = [
        write(tmp_path, "ok1.txt", paras("ok1", 2)),
        write(tmp_path, "bad.txt", "FAIL please"),
        write(tmp_path, "ok2.txt", paras("ok2", 1)),
    ]
    missing = SourceFile(tmp_path / "gone.txt", str(tmp_path / "gone.txt"), "gone.txt")
    results = run(pipeline, [*files, missing])
    assert [r.status for r in results] == ["indexed", "failed", "indexed", "failed"]
    assert results[1].reason == "bad.txt: asked to fail" and results[1].error is not None
    assert results[1].error.status == 422
    assert "cannot read gone.txt" in (results[3].reason or "")
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent() and seen.states[results[1].document_id or ""] == "failed"


def test_a_file_over_the_limit_fails_without_being_read(tmp_path: Path, isolated_env: Path) -> None:
    settings = Settings(data_dir=isolated_env, max_upload_bytes=100)
    pipeline = open_pipeline(settings, HashEmbedder(), paragraph_chunks)
    result = run(pipeline, [write(tmp_path, "big.txt", "x" * 101)])[0]
    assert (result.status, result.document_id, result.error.status if result.error else None) == ("failed", None, 413)


def test_an_embedder_failure_ends_the_run_and_leaves_nothing_half_done(settings: Settings, tmp_path: Path) -> None:
    embedder = HashEmbedder(fail_after=2)
    pipeline = open_pipeline(settings, embedder, paragraph_chunks)
    files = [write(tmp_path, f"f{i}.txt", paras(f"f{i}", 3)) for i in range(6)]
    with pytest.raises(EmbedderUnavailable):
        run(pipeline, files)
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent()
    assert set(seen.states.values()) <= {"indexed", "failed"}
    assert not pipeline.locks._locks  # every document lock was given back
    # A re-run with a working embedder finishes the job.
    pipeline.embedder = HashEmbedder()
    assert {r.status for r in run(pipeline, files)} <= {"indexed", "unchanged"}
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent() and len(seen.indexed()) == 6


def test_chunks_a_failed_run_could_not_delete_go_with_the_next_run(settings: Settings, tmp_path: Path) -> None:
    """A full disk: the store refuses a write after some chunks are in, then refuses the clean-up's
    delete too. The document stays pending with its chunks; the next run of this process removes them."""
    from rag.core.errors import StoreUnavailable

    pipeline = open_pipeline(settings, HashEmbedder(), paragraph_chunks, inflight=1)
    stores = pipeline.stores
    write_chunks, delete_chunks, writes = stores.write_chunks, stores.delete_chunks, []

    def full_after_one(*args: object) -> None:
        writes.append(args)
        if len(writes) > 1:
            raise StoreUnavailable("Chroma is unavailable: database or disk is full")
        write_chunks(*args)  # type: ignore[arg-type]

    def cannot_delete(*args: object) -> None:
        raise StoreUnavailable("Chroma is unavailable: database or disk is full")

    stores.write_chunks, stores.delete_chunks = full_after_one, cannot_delete  # type: ignore[method-assign]
    big = write(tmp_path, "big.txt", paras("big", 100))  # several batches of 32
    with pytest.raises(StoreUnavailable):
        run(pipeline, [big])
    left = census(settings.data_dir, "default", pipeline.store)
    big_id = document_id(big.path.read_bytes())
    assert left.states == {big_id: "pending"} and left.chroma[big_id] > 0
    # The disk has room again: the next upload's run takes the leftovers out first.
    stores.write_chunks, stores.delete_chunks = write_chunks, delete_chunks  # type: ignore[method-assign]
    (result,) = run(pipeline, [write(tmp_path, "small.txt", paras("small", 2))])
    after = census(settings.data_dir, "default", pipeline.store)
    assert result.status == "indexed" and after.consistent() and big_id not in after.states


def test_a_cancelled_run_cleans_up(settings: Settings, tmp_path: Path) -> None:
    embedder = HashEmbedder(delay_s=0.2)
    pipeline = open_pipeline(settings, embedder, paragraph_chunks)
    files = [write(tmp_path, f"f{i}.txt", paras(f"f{i}", 5)) for i in range(8)]

    async def cancel_midway() -> None:
        task = asyncio.create_task(pipeline.run(files, "default"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent()
    assert "pending" not in seen.states.values()


def test_delete_removes_every_chunk(pipeline: IngestPipeline, tmp_path: Path, settings: Settings) -> None:
    results = run(pipeline, [write(tmp_path, "a.txt", paras("a", 3)), write(tmp_path, "b.txt", paras("b", 2))])
    record = asyncio.run(pipeline.delete("default", results[0].document_id or ""))
    assert record is not None and record.chunks == 3
    assert asyncio.run(pipeline.delete("default", "no-such-id")) is None
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent() and seen.indexed() == {results[1].document_id: 2}


def test_collections_are_separate(pipeline: IngestPipeline, tmp_path: Path, settings: Settings) -> None:
    file = write(tmp_path, "a.txt", paras("a", 2))
    assert run(pipeline, [file], "one")[0].status == "indexed"
    assert run(pipeline, [file], "two")[0].status == "indexed"
    assert pipeline.catalog.collections() == [("one", 1), ("two", 1)]
    assert census(settings.data_dir, "two", pipeline.store).consistent()


def test_recover_removes_what_a_dead_process_left(settings: Settings, tmp_path: Path) -> None:
    """A process that died mid-ingest (its lease free) left a pending document with some chunks and a
    deleting one: recovery deletes their chunks and rows; indexed documents stay."""
    pipeline = open_pipeline(settings, HashEmbedder(), paragraph_chunks)
    kept, doomed = run(
        pipeline, [write(tmp_path, "keep.txt", paras("k", 2)), write(tmp_path, "old.txt", paras("o", 2))]
    )
    dead = OwnerLease(settings.data_dir / "owners")
    catalog = pipeline.catalog
    catalog.claim(
        "default", "half", source="half.txt", name="half.txt", size=1, owner=dead.token, is_live=lambda t: False
    )
    pipeline.stores.write_chunks(
        "default",
        paragraph_chunks(b"one\n\ntwo", SourceFile(tmp_path, "half.txt", "half.txt"), "half").records,
        [HashEmbedder()._vector("x")] * 2,
    )
    catalog.mark_deleting("default", doomed.document_id or "", owner=dead.token, is_live=lambda t: False)
    assert pipeline.recover() == []  # the owner is alive: nothing to do
    dead.release()
    assert sorted(r.doc_id for r in pipeline.recover()) == sorted(["half", doomed.document_id])
    seen = census(settings.data_dir, "default", pipeline.store)
    assert seen.consistent() and seen.indexed() == {kept.document_id: 2}


def test_a_document_another_live_process_is_indexing_is_busy(settings: Settings, tmp_path: Path) -> None:
    pipeline = open_pipeline(settings, HashEmbedder(), paragraph_chunks)
    file = write(tmp_path, "a.txt", paras("a", 1))
    other = OwnerLease(settings.data_dir / "owners")
    doc_id = document_id(file.path.read_bytes())
    pipeline.catalog.claim("default", doc_id, source="a", name="a", size=1, owner=other.token, is_live=other.is_live)
    result = run(pipeline, [file])[0]
    assert result.status == "failed" and isinstance(result.error, Conflict)
    other.release()
    assert run(pipeline, [file])[0].status == "indexed"  # the other process is gone: taken over


def test_catalog_switch_is_atomic(tmp_path: Path) -> None:
    catalog = DocumentCatalog(tmp_path / "catalog.sqlite")
    never = lambda token: False  # noqa: E731
    for doc in ("v1", "v2"):
        catalog.claim("c", doc, source="s", name="s", size=1, owner="me", is_live=never)
    catalog.mark_indexed("c", "v1", chunks=1, pages=None, owner="me")
    assert catalog.indexed_ids("c", ["v1", "v2"]) == {"v1"}
    # Another reader of the catalog (the search of another request) looks at every statement of the switch.
    reader = DocumentCatalog(tmp_path / "catalog.sqlite")
    seen: list[tuple[str, set[str]]] = []
    catalog._db.set_trace_callback(lambda sql: seen.append((sql, reader.indexed_ids("c", ["v1", "v2"]))))
    assert catalog.mark_indexed("c", "v2", chunks=2, pages=3, owner="me") == ["v1"]
    catalog._db.set_trace_callback(None)
    assert any(sql.lstrip().upper().startswith("UPDATE") for sql, _ in seen), "the switch was watched"
    assert {frozenset(ids) for _, ids in seen} == {frozenset({"v1"})}, "never both, never neither, until it commits"
    assert reader.indexed_ids("c", ["v1", "v2"]) == {"v2"}
    assert catalog.get("c", "v1").state == "deleting"  # type: ignore[union-attr]
    assert catalog.get("c", "v2").to_api()["pages"] == 3  # type: ignore[union-attr]


def test_leases_see_each_other_across_processes(tmp_path: Path) -> None:
    lease = OwnerLease(tmp_path)
    code = (
        "import sys; from pathlib import Path; from rag.store.catalog import OwnerLease;"
        f"print(OwnerLease(Path(sys.argv[1])).is_live({lease.token!r}))"
    )
    alive = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert alive.stdout.strip() == "True"
    lease.release()
    gone = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert gone.stdout.strip() == "False"


# Integration: the real embedding server, loaders and chunker.


@pytest.mark.integration
def test_real_files_through_the_real_embedder(ingest_settings: Settings, tmp_path: Path) -> None:
    from rag.clients.embedding import EmbeddingClient
    from tests import hostile

    folder = tmp_path / "docs"
    folder.mkdir()
    cmrc = json.loads(CMRC.read_text())
    chinese = "\n\n".join(p["context"] for p in cmrc["data"][0]["paragraphs"][:4])
    (folder / "zh.txt").write_text(chinese, encoding="utf-8")
    (folder / "utf16.txt").write_bytes("Zürich text in UTF-16 with a BOM.\n\nSecond paragraph.".encode("utf-16"))
    (folder / "gbk.txt").write_bytes(("中文文本。" * 40).encode("gbk"))
    (folder / "paper.pdf").write_bytes(hostile.text_pdf([["Page one text about rivers."], ["Page two about hills."]]))
    (folder / "empty.txt").write_bytes(b"")
    paths = sorted(folder.iterdir())

    async def go() -> list:
        embedder = EmbeddingClient(ingest_settings.embed_url, model=ingest_settings.embed_model)
        pipeline = open_pipeline(ingest_settings, embedder)
        try:
            return await pipeline.run([SourceFile(p, str(p), p.name) for p in paths], "default")
        finally:
            await embedder.aclose()

    results = {Path(r.source).name: r for r in asyncio.run(go())}
    assert results["empty.txt"].status == "failed" and results["empty.txt"].error.status == 422  # type: ignore[union-attr]
    assert all(r.status == "indexed" for n, r in results.items() if n != "empty.txt"), results
    seen = census(ingest_settings.data_dir, "default")
    assert seen.consistent()
    good = [p for p in paths if p.name != "empty.txt"]
    assert seen.indexed() == expected_chunks(good, ingest_settings)
    pdf = ChunkStoreView(ingest_settings).metadata(results["paper.pdf"].document_id or "")
    assert sorted(m["page"] for m in pdf) == [1, 2]


class ChunkStoreView:
    def __init__(self, settings: Settings) -> None:
        from rag.store.chroma_vectors import ChunkStore

        self.store = ChunkStore.open(settings)

    def metadata(self, doc_id: str) -> list[dict]:
        return self.store.collection("default").get(where={"doc_id": doc_id}, include=["metadatas"])["metadatas"]
