"""`ingest --watch`: a watched folder keeps its collection in step (real watchfiles events, the real
pipeline on the store, the real embedding server)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.backends import KnownDocument, LocalBackend
from ingest.cli import Report
from ingest.watch import FolderWatch
from rag.core.config import Settings

pytestmark = pytest.mark.integration

WAIT_S = 120  # how long a state may take to come about before the test fails (not a speed target)


async def until(backend: LocalBackend, wanted: Callable[[dict[str, KnownDocument]], bool]) -> dict[str, KnownDocument]:
    """The indexed documents by file name, once `wanted` holds for them."""
    for _ in range(WAIT_S * 10):
        docs = {Path(d.source).name: d for d in await backend.documents("default") if d.state == "indexed"}
        if wanted(docs):
            return docs
        await asyncio.sleep(0.1)
    raise AssertionError(f"not reached; the catalog holds {sorted(docs)}")


class Watching:
    """A FolderWatch running in the background over `folder`, on the store opened here."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        self.settings, self.folder = settings, folder
        self.report = Report(as_json=False, total=0)
        self.lines: list[str] = []

    async def __aenter__(self) -> Watching:
        self.backend = await LocalBackend(self.settings).__aenter__()
        self.watch = FolderWatch(self.backend, [self.folder], "default", self.report, self.lines.append)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.watch.run(self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task
        await self.backend.__aexit__(None, None, None)

    async def said(self, wanted: Callable[[str], bool]) -> None:
        """Wait until the watch has said a line for which `wanted` holds (it says so once a deletion is done)."""
        for _ in range(WAIT_S * 10):
            if any(wanted(line) for line in self.lines):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"never said; the lines: {self.lines}")

    def statuses(self, name: str) -> list[str]:
        return [r.status for r in self.report.results if Path(r.source).name == name]


def test_a_watched_folder_picks_up_new_changed_deleted_and_renamed_files(ingest_settings: Settings, tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "rivers.txt").write_text("The Danube flows through ten countries.")

    async def main() -> None:
        async with Watching(ingest_settings, folder) as w:
            first = await until(w.backend, lambda d: set(d) == {"rivers.txt"})

            (folder / "towers.txt").write_text("The Eiffel Tower is 330 metres tall.")
            await until(w.backend, lambda d: set(d) == {"rivers.txt", "towers.txt"})

            (folder / "rivers.txt").write_text("The Danube flows through ten countries and four capitals.")
            changed = await until(
                w.backend, lambda d: d.get("rivers.txt") and d["rivers.txt"].id != first["rivers.txt"].id
            )
            assert set(changed) == {"rivers.txt", "towers.txt"}, "the old version is gone"

            (folder / "towers.txt").rename(folder / "eiffel.txt")
            moved = await until(w.backend, lambda d: set(d) == {"rivers.txt", "eiffel.txt"})
            assert moved["eiffel.txt"].id == changed["towers.txt"].id
            assert w.statuses("eiffel.txt") == ["unchanged"], "a rename embeds nothing: the content is known"

            (folder / "rivers.txt").unlink()
            await until(w.backend, lambda d: set(d) == {"eiffel.txt"})  # out of search once marked for deletion
            await w.said(lambda line: line.startswith("deleted") and "rivers.txt" in line)

    asyncio.run(main())


def test_a_restart_catches_up_with_what_changed_while_nothing_watched(ingest_settings: Settings, tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "old.txt").write_text("A note about glaciers in the Alps.")
    (folder / "kept.txt").write_text("A note about deserts and dunes.")

    async def main() -> None:
        async with Watching(ingest_settings, folder) as w:
            await until(w.backend, lambda d: set(d) == {"old.txt", "kept.txt"})
        (folder / "old.txt").unlink()
        (folder / "new.txt").write_text("A note about volcanoes in Iceland.")
        async with Watching(ingest_settings, folder) as w:
            await until(w.backend, lambda d: set(d) == {"kept.txt", "new.txt"})
            assert w.statuses("kept.txt") == ["unchanged"]

    asyncio.run(main())


def test_a_burst_of_changes_is_coalesced_into_few_ingests(ingest_settings: Settings, tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()

    async def main() -> None:
        async with Watching(ingest_settings, folder) as w:
            await until(w.backend, lambda d: True)
            for i in range(300):
                (folder / f"note-{i:03}.txt").write_text(f"Note number {i} about the sea.")
            for i in range(300):  # and each saved a second time
                (folder / f"note-{i:03}.txt").write_text(f"Note number {i} about the sea and its tides.")
            docs = await until(w.backend, lambda d: len(d) == 300)
            assert w.watch.passes <= 5, f"{w.watch.passes} ingests for 600 changes"
            assert all(w.statuses(name).count("indexed") <= 2 for name in docs)

    asyncio.run(main())


def test_a_file_still_being_written_is_indexed_once_complete(ingest_settings: Settings, tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()
    sentences = [f"Sentence {i} of a long report on harbours." for i in range(40)]

    async def main() -> None:
        async with Watching(ingest_settings, folder) as w:
            await until(w.backend, lambda d: True)
            with (folder / "report.txt").open("w") as out:
                for sentence in sentences:  # a slow writer: a sentence every 0.1 s
                    out.write(sentence + " ")
                    out.flush()
                    await asyncio.sleep(0.1)
            await until(w.backend, lambda d: "report.txt" in d)
            await asyncio.sleep(2 * w.watch.settle_s + 1)  # anything still pending would land now
            assert w.statuses("report.txt") == ["indexed"], "indexed once, not half and then whole"
            chunks = w.backend.pipeline.lexical.document_chunks(
                "default", (await until(w.backend, lambda d: True))["report.txt"].id
            )
            assert sentences[-1] in " ".join(text for text, _ in chunks)

    asyncio.run(main())


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file: no permission is denied")
def test_a_file_that_cannot_be_read_is_reported_once(ingest_settings: Settings, tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()

    async def main() -> None:
        async with Watching(ingest_settings, folder) as w:
            await until(w.backend, lambda d: True)
            secret = folder / "secret.txt"
            secret.write_text("Not for you.")
            secret.chmod(0)
            (folder / "open.txt").write_text("For everyone.")
            await until(w.backend, lambda d: "open.txt" in d)
            await asyncio.sleep(3)
            assert sum("secret.txt" in line for line in w.lines) == 1

    asyncio.run(main())


def test_watch_takes_folders_only(tmp_path: Path):
    from click.testing import CliRunner

    from ingest.cli import cli

    (tmp_path / "a.txt").write_text("x")
    refused = CliRunner().invoke(cli, ["--watch", str(tmp_path / "a.txt")])
    assert refused.exit_code == 2 and "--watch takes folders" in refused.output
