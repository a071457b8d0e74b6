"""What `ingest --watch` takes, on real watchfiles events over a real folder, with a backend that keeps its
catalog in a dict (a unit test of the watch alone): a symbolic link out of the folder is refused, a file
that became a folder is forgotten, and a file written slowly is indexed once, whole."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from ingest.backends import KnownDocument
from ingest.pipeline import FileResult, SourceFile
from ingest.watch import FolderWatch

WAIT_S = 60  # how long a state may take to come about before the test fails (not a speed target)


class DictBackend:
    """A catalog of sources in a dict; every ingest is recorded with each file's bytes then."""

    name = "dict"

    def __init__(self) -> None:
        self.docs: dict[str, KnownDocument] = {}
        self.ingested: list[tuple[str, bytes]] = []

    async def ingest(self, files: Sequence[SourceFile], collection: str, progress: object) -> list[FileResult]:
        for f in files:
            self.ingested.append((f.source, f.path.read_bytes()))
            self.docs[f.source] = KnownDocument(f"id-{len(self.ingested)}", f.source, "indexed")
        return []

    async def documents(self, collection: str) -> list[KnownDocument]:
        return list(self.docs.values())

    async def state_of(self, collection: str, doc_id: str) -> str | None:
        return None

    async def delete(self, collection: str, doc_id: str, source: str | None = None) -> None:
        self.docs = {s: d for s, d in self.docs.items() if d.id != doc_id}

    async def counts(self, collection: str) -> object:
        return None


async def until(wanted: Callable[[], bool]) -> None:
    for _ in range(WAIT_S * 10):
        if wanted():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("not reached")


async def watching(folder: Path, body: Callable[[DictBackend, list[str]], object]) -> None:
    backend, lines = DictBackend(), []
    watch = FolderWatch(backend, [folder], "default", lambda *a: None, lines.append)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        await asyncio.sleep(1)  # the first sync and the watcher's start
        await body(backend, lines)  # type: ignore[misc]
    finally:
        stop.set()
        await task


def test_a_symbolic_link_out_of_the_folder_is_refused_and_one_inside_is_taken(tmp_path: Path) -> None:
    folder, outside = tmp_path / "w", tmp_path / "private"
    folder.mkdir()
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0\n")
    (folder / "real.txt").write_text("inside")

    async def body(backend: DictBackend, lines: list[str]) -> None:
        (folder / "passwd.txt").symlink_to(outside / "passwd")
        (folder / "alias.txt").symlink_to(folder / "real.txt")
        (folder / "note.txt").write_text("a note")
        await until(lambda: str((folder / "note.txt").resolve()) in backend.docs)
        await asyncio.sleep(3)
        assert str((outside / "passwd").resolve()) not in backend.docs
        assert sum("refused" in line and "passwd" in line for line in lines) == 1, lines

    asyncio.run(watching(folder, body))
    # The sync at start refuses it too.
    asyncio.run(watching(folder, lambda b, lines: _nothing_outside(b, outside)))


async def _nothing_outside(backend: DictBackend, outside: Path) -> None:
    await until(lambda: bool(backend.docs))
    assert all(not Path(s).is_relative_to(outside.resolve()) for s in backend.docs), backend.docs


def test_a_file_that_became_a_folder_is_forgotten(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "thing").write_text("a file first")

    async def body(backend: DictBackend, lines: list[str]) -> None:
        thing = str((folder / "thing").resolve())
        await until(lambda: thing in backend.docs)
        (folder / "thing").unlink()
        (folder / "thing").mkdir()
        (folder / "thing" / "inner.txt").write_text("a file in the folder")
        await until(lambda: str((folder / "thing" / "inner.txt").resolve()) in backend.docs)
        await until(lambda: thing not in backend.docs)

    asyncio.run(watching(folder, body))


def test_a_file_written_once_a_second_for_11_s_is_indexed_once_whole(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    folder.mkdir()
    lines = [f"line {i} of a slowly written log\n".encode() for i in range(12)]

    async def body(backend: DictBackend, said: list[str]) -> None:
        path = folder / "slow.txt"
        with path.open("wb") as out:
            for line in lines:
                out.write(line)
                out.flush()
                await asyncio.sleep(1)
        await until(lambda: any(s == str(path.resolve()) for s, _ in backend.ingested))
        await asyncio.sleep(5)  # anything still pending would land now
        versions = [data for s, data in backend.ingested if s == str(path.resolve())]
        assert versions == [b"".join(lines)], f"indexed {len(versions)} times"

    asyncio.run(watching(folder, body))
