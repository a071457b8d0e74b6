"""`ingest --watch`: keep a collection in step with folders, with `watchfiles` (Rust `notify` events).

start     one sync pass (index what is new or changed, delete what is gone: the catalog is the
          state, so a restart catches up with whatever changed while nothing watched)
events    watchfiles groups a burst of changes into one set (DEBOUNCE_MS): 10,000 saves become one
          pass over the distinct paths, and one batched ingest of the files among them
a pass    a file is complete once its size and mtime have held still for SETTLE_S (a file last
          changed longer ago is taken at once; a younger one is looked at again when it is that old):
          one still moving is kept for the next pass, so a file written slowly is indexed once, whole;
          a file whose real path lies outside the watched folders (a symbolic link out of them) is
          refused, said once; unreadable files are reported once (until they change); then new and
          changed files are indexed, and last the names of files that are gone, or are folders now,
          are deleted. In that order a rename costs no embedding: the new name is the same
          content (`unchanged`, the name added), and deleting the old name keeps the content.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import watchfiles

from .backends import Backend
from .folders import collect_files, stale_documents
from .pipeline import Progress, SourceFile

DEBOUNCE_MS = 500  # the longest a burst of changes is gathered before a pass
STEP_MS = 100  # a pass starts once no change came for this long
# A file whose size and mtime hold still this long is complete: longer than the pauses of a writer that
# appends once a second (at 0.5 s such a file of 11 s was indexed six times, half-versions searchable).
SETTLE_S = 2.0


@dataclass
class FolderWatch:
    backend: Backend
    roots: Sequence[Path]
    collection: str
    progress: Progress
    say: Callable[[str], None]
    pattern: str | None = None
    recursive: bool = True
    settle_s: float = SETTLE_S
    passes: int = 0  # ingest calls made after the first sync (a burst is one)
    _pending: set[Path] = field(default_factory=set)
    _refused: dict[Path, tuple[int, int]] = field(default_factory=dict)  # unreadable, as (size, mtime) then
    _outside: set[Path] = field(default_factory=set)  # links out of the watched folders, said once
    _scratch: watchfiles.DefaultFilter = field(default_factory=watchfiles.DefaultFilter)

    def __post_init__(self) -> None:
        self.roots = [r.resolve() for r in self.roots]  # the catalog's sources are resolved paths

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Sync once, then apply changes until `stop` is set (or forever)."""
        started = time.time_ns()
        synced = await self.sync()
        roots = [str(r) for r in self.roots]
        watching = False
        async for changes in watchfiles.awatch(
            *roots,
            watch_filter=self._wanted,
            debounce=DEBOUNCE_MS,
            step=STEP_MS,
            stop_event=stop,
            recursive=self.recursive,
            rust_timeout=int(self.settle_s * 2000),
            yield_on_timeout=True,
            ignore_permission_denied=True,
        ):
            if not watching:  # the watcher runs from its first answer on: what changed before that, since the sync
                watching = True
                self._pending |= self._changed_since(started, synced)
            self._pending.update(Path(path) for _, path in changes)
            if self._pending:
                await self.apply()

    async def sync(self) -> set[Path]:
        """What `ingest --sync` does: index the files found, delete documents whose file is gone. Returns
        the files found."""
        found = collect_files(self.roots, self.pattern, self.recursive)
        files = await self._complete(found)
        if files:
            await self.backend.ingest(files, self.collection, self.progress)
        known = await self.backend.documents(self.collection)
        for doc in stale_documents(known, self.roots, found, self.recursive):
            await self._delete(doc.id, doc.source)
        return {f.path for f in found}

    def _changed_since(self, started_ns: int, synced: set[Path]) -> set[Path]:
        """Files new or modified since `started_ns`, and files of the sync that are gone (a stat each)."""
        now = {f.path for f in collect_files(self.roots, self.pattern, self.recursive)}
        touched = {p for p in now if p not in synced or ((s := _stamp(p)) is not None and s[1] >= started_ns)}
        return touched | (synced - now)

    async def apply(self) -> None:
        """One pass over the paths that changed since the last."""
        paths, self._pending = self._pending, set()
        present = [p for p in paths if p.exists()]
        gone = [p for p in paths if not p.is_file()]  # deleted, or a folder now: its file's name goes
        files = collect_files(
            [p for p in present if p.is_dir() or self._wanted(None, str(p))], self.pattern, self.recursive, self.roots
        )
        files = await self._complete(files)
        if files:
            self.passes += 1
            await self.backend.ingest(files, self.collection, self.progress)
        if gone:
            await self._forget(gone)

    async def _complete(self, files: list[SourceFile]) -> list[SourceFile]:
        """The files inside the watched folders that are complete and readable; the others wait for their
        next change or pass."""
        files = [f for f in files if self._inside(f.path)]
        before = {f.path: _stamp(f.path) for f in files}
        ages_s = [(time.time_ns() - s[1]) / 1e9 for s in before.values() if s is not None]
        if ages_s:  # until the youngest file is settle_s old: older ones held still that long already
            await asyncio.sleep(max(0.0, self.settle_s - min(ages_s)))
        ready = []
        for file in files:
            stamp = _stamp(file.path)
            if stamp is None:
                continue  # gone meanwhile: its deletion event comes
            if stamp != before[file.path] or time.time_ns() - stamp[1] < self.settle_s * 1e9:
                self._pending.add(file.path)  # still being written
            elif self._readable(file.path, stamp):
                ready.append(file)
        return ready

    def _inside(self, path: Path) -> bool:
        """`path` (resolved: the real file) lies in a watched folder; a link out of them is refused."""
        if any(path.is_relative_to(root) for root in self.roots):
            self._outside.discard(path)
            return True
        if path not in self._outside:
            self.say(f"{'refused':<13} {path}: outside the watched folders (reached by a symbolic link)")
            self._outside.add(path)
        return False

    def _readable(self, path: Path, stamp: tuple[int, int]) -> bool:
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            if self._refused.get(path) != stamp:
                self.say(f"{'failed':<13} {path}: {exc.strerror or exc} (tried again when it changes)")
            self._refused[path] = stamp
            return False
        self._refused.pop(path, None)
        return True

    async def _forget(self, gone: list[Path]) -> None:
        """Delete the names of files (or whole folders) that are gone."""
        known = await self.backend.documents(self.collection)
        for doc in known:
            source = Path(doc.source)
            if not source.is_absolute() or source.is_file():
                continue
            if any(source == g or source.is_relative_to(g) for g in gone):
                await self._delete(doc.id, doc.source)

    async def _delete(self, doc_id: str, source: str) -> None:
        await self.backend.delete(self.collection, doc_id, source)
        self.say(f"{'deleted':<13} {source}")

    def _wanted(self, change: Any, path: str) -> bool:
        """Not hidden (nor in a hidden folder under a root), not an editor's scratch file, matching --glob."""
        if not self._scratch(change, path):
            return False
        p = Path(path)
        root = next((r for r in self.roots if p.is_relative_to(r)), None)
        parts = p.relative_to(root).parts if root is not None else (p.name,)
        if any(part.startswith(".") for part in parts):
            return False
        return self.pattern is None or p.is_dir() or not p.exists() or p.match(self.pattern)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if not os.path.isdir(path) else None
