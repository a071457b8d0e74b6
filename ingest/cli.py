"""The `ingest` command: index files and folders into a collection, through the running API or directly."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from rag.core.command_line import load_settings, run_cli
from rag.core.config import Settings
from rag.store.catalog import DocumentCounts

from .backends import ApiBackend, Backend, KnownDocument, LocalBackend, choose_api, file_id
from .folders import collect_files, stale_documents
from .pipeline import FileResult, SourceFile
from .watch import FolderWatch

EXAMPLES = """
\b
Examples:
  ingest report.pdf notes.md                   two files into the default collection
  ingest docs/ --recursive --glob '*.pdf'      every PDF under docs/
  ingest docs/ -r --sync                       and delete documents whose file is gone
  ingest docs/ -r --watch                      and keep the collection in step with docs/
  ingest docs/ -r --dry-run                    show what would change, change nothing
  ingest big/ -r --json > summary.json         a machine-readable summary
  ingest paper.pdf --server http://gpu-box:8000 --collection papers
"""


@click.command(epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "-c",
    "--collection",
    envvar="RAG_COLLECTION",
    help="Collection to index into.  [env: RAG_COLLECTION; default: default]",
)
@click.option(
    "-g",
    "--glob",
    "pattern",
    envvar="RAG_INGEST_GLOB",
    help="In folders, only files whose name matches, e.g. '*.pdf'.  [env: RAG_INGEST_GLOB]",
)
@click.option(
    "-r", "--recursive", is_flag=True, help="Walk folders recursively (hidden files and folders are skipped)."
)
@click.option(
    "--sync",
    is_flag=True,
    help="Afterwards delete documents whose source file lies under PATHS but is no longer among the files found.",
)
@click.option(
    "-n", "--dry-run", is_flag=True, help="Report what would be indexed, left unchanged and deleted; change nothing."
)
@click.option(
    "--watch",
    is_flag=True,
    help="Keep watching the folders: new and changed files are indexed once "
    "complete, deleted ones removed, renamed ones renamed (Ctrl-C stops). Starts with a --sync pass.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout (progress stays on stderr).")
@click.option(
    "--server",
    envvar="RAG_INGEST_SERVER",
    help="Send files to the API at this URL.  [env: RAG_INGEST_SERVER; default: the API at RAG_API_HOST:RAG_API_PORT "
    "when one answers, else the store directly]",
)
def cli(
    paths: tuple[Path, ...],
    collection: str | None,
    pattern: str | None,
    recursive: bool,
    sync: bool,
    dry_run: bool,
    watch: bool,
    as_json: bool,
    server: str | None,
) -> None:
    """Index files into a collection: load, chunk, embed, store.

    A PATH is a file or a folder. Text, Markdown, HTML, PDF and DOCX are read, and images (PNG, JPEG,
    TIFF, WebP, BMP) by OCR, as are scanned PDF pages (the type comes from the bytes), gzipped too
    (README.Debian.gz). Unchanged files cost nothing; a changed file replaces its
    previous version. A file that fails is reported with its reason and the run goes on; the exit
    status is 1 if any file failed.
    """
    if not any(p.is_dir() for p in paths) and (pattern or recursive):
        raise click.UsageError("--glob and --recursive apply to folders, and no PATH is a folder")
    if server and not server.startswith(("http://", "https://")):
        raise click.UsageError(f"--server needs an http(s) URL, not {server!r}")
    if watch and (dry_run or not all(p.is_dir() for p in paths)):
        raise click.UsageError("--watch takes folders, and not --dry-run")
    settings = load_settings()
    from rag.store.catalog import check_collection

    collection = check_collection(collection or settings.collection)
    if watch:
        report = Report(as_json=False, total=0)
        try:
            asyncio.run(_watch(settings, paths, collection, pattern, recursive, server, report))
        except KeyboardInterrupt:
            report.line("ingest: stopped watching")
        return
    files = collect_files(paths, pattern, recursive)
    report = Report(as_json=as_json, total=len(files), dry_run=dry_run)
    asyncio.run(_main(settings, files, paths, collection, recursive, sync, dry_run, server, report))
    report.summary(collection)
    if report.count("failed"):
        click.get_current_context().exit(1)


async def _main(
    settings: Settings,
    files: list[SourceFile],
    roots: Sequence[Path],
    collection: str,
    recursive: bool,
    sync: bool,
    dry_run: bool,
    server: str | None,
    report: Report,
) -> None:
    url = await choose_api(settings, server, report.line, who="ingest")
    backend = _backend(settings, url, report, read_only=dry_run)
    async with backend:
        report.mode = backend.name
        report.where = f"the API at {url}" if url else f"data dir {settings.data_dir}"
        if url is None:  # said once the store is ours: a held store is one line of error alone
            report.line(f"ingest: via local, the store at {settings.data_dir} (no API answers at {settings.api_url})")
        if dry_run:
            await _dry_run(backend, files, collection, report)
        else:
            with report.progress():
                await backend.ingest(files, collection, report)
        if sync:
            stale = stale_documents(await backend.documents(collection), roots, files, recursive)
            for doc in stale:
                if not dry_run:
                    await backend.delete(collection, doc.id, doc.source)
                report.deleted.append(doc)
                report.line(f"{'would delete' if dry_run else 'deleted':<13} {doc.source}")
        report.holds = await backend.counts(collection)


async def _watch(
    settings: Settings,
    roots: Sequence[Path],
    collection: str,
    pattern: str | None,
    recursive: bool,
    server: str | None,
    report: Report,
) -> None:
    url = await choose_api(settings, server, report.line, who="ingest")
    backend = _backend(settings, url, report)
    async with backend:
        report.mode = backend.name
        report.line(
            f"ingest: watching {', '.join(map(str, roots))} for '{collection}' via {backend.name} (Ctrl-C stops)"
        )
        await FolderWatch(backend, roots, collection, report, report.line, pattern=pattern, recursive=recursive).run()


def _backend(
    settings: Settings, url: str | None, report: Report, *, read_only: bool = False
) -> ApiBackend | LocalBackend:
    """The API at `url`, else the store here: the embedding model is prepared on this machine first (its
    tokenizer cuts the chunks), and an embedding server of its own is started for the run if none answers."""
    if url:
        return ApiBackend(url, settings)
    from rag.deploy.e5_rebuild import prepare_embedder

    prepare_embedder(settings, report.line)
    return LocalBackend(settings, read_only=read_only, own_embedder=report.line)


async def _dry_run(backend: Backend, files: list[SourceFile], collection: str, report: Report) -> None:
    for file in files:
        doc_id = await asyncio.to_thread(file_id, file.path)
        state = await backend.state_of(collection, doc_id)
        status = "unchanged" if state == "indexed" else "would index"
        report.results.append(
            FileResult(file.name, file.source, doc_id, "unchanged" if state == "indexed" else "indexed")
        )
        report.line(f"{status:<13} {file.source}")


@dataclass
class Report:
    """Progress while running (a bar on a terminal, plain lines otherwise) and the summary at the end."""

    as_json: bool
    total: int
    dry_run: bool = False
    mode: str = ""
    where: str = ""  # the API's URL or the data dir, said with the mode
    results: list[FileResult] = field(default_factory=list)
    deleted: list[KnownDocument] = field(default_factory=list)
    holds: DocumentCounts = field(default_factory=DocumentCounts)  # the collection after the run
    chunks: int = 0
    started: float = field(default_factory=time.monotonic)
    _bar: Any = None
    _task: Any = None

    def progress(self) -> Any:
        from contextlib import nullcontext

        if not sys.stderr.isatty():
            return nullcontext()
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("files  {task.fields[chunks]} chunks  {task.fields[rate]:.1f} chunks/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._task = self._bar.add_task("ingest", total=self.total, chunks=0, rate=0.0)
        return self._bar

    # The pipeline's Progress.

    def file_started(self, file: SourceFile) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=_shorten(file.name))

    def page_read(self, file: SourceFile, n: int, total: int | None) -> None:
        self.line(f"{'reading':<13} {file.source}: OCR page {n}" + (f" of {total}" if total else ""))

    def chunks_stored(self, n: int) -> None:
        self.chunks += n
        if self._bar is not None:
            self._bar.update(self._task, chunks=self.chunks, rate=self.rate())

    def file_done(self, result: FileResult) -> None:
        self.results.append(result)
        if self._bar is not None:
            self._bar.advance(self._task)
        if result.status == "failed":
            self.line(f"{'failed':<13} {result.source}: {result.reason}")
        elif self._bar is None:
            self.line(f"{result.status:<13} {result.source} ({result.chunks} chunk{'' if result.chunks == 1 else 's'})")
        for warning in result.warnings:
            self.line(f"{'warning':<13} {result.source}: {warning}")

    # Output.

    def line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            click.echo(text, err=True)

    def rate(self) -> float:
        seconds = time.monotonic() - self.started
        return self.chunks / seconds if seconds > 0 else 0.0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def summary(self, collection: str) -> None:
        seconds = time.monotonic() - self.started
        indexed_chunks = sum(r.chunks for r in self.results if r.status == "indexed")
        if self.as_json:
            body = {
                "collection": collection,
                "dry_run": self.dry_run,
                "mode": self.mode,
                "files": {s: self.count(s) for s in ("indexed", "unchanged", "failed")}
                | {"deleted": len(self.deleted)},
                "chunks": indexed_chunks,
                "seconds": round(seconds, 3),
                "chunks_per_s": round(indexed_chunks / seconds, 2) if seconds > 0 else 0.0,
                "results": [r.to_api() | {"source": r.source} for r in self.results],
                "deleted": [{"document_id": d.id, "source": d.source} for d in self.deleted],
                # What the collection holds now, as the API, `rag store check` and the page count it.
                "collection_documents": self.holds.documents,
                "collection_failed": self.holds.failed,
            }
            click.echo(json.dumps(body, ensure_ascii=False, indent=2))
            return
        if self.dry_run:
            click.echo(
                f"dry run: {self.count('indexed')} to index, {self.count('unchanged')} unchanged, "
                f"{len(self.deleted)} to delete in '{collection}' via {self.mode} ({self.where}); nothing changed"
            )
            return
        deleted = f", {len(self.deleted)} deleted" if self.deleted else ""
        click.echo(
            f"files: {self.count('indexed')} indexed, {self.count('unchanged')} unchanged, {self.count('failed')} failed"
            f"{deleted}; {indexed_chunks} chunks in {seconds:.1f} s ({indexed_chunks / max(seconds, 1e-9):.1f} chunks/s)"
            f" into '{collection}' via {self.mode} ({self.where}); '{collection}' holds {_count(self.holds.documents, 'document')}"
            + (f" and {_count(self.holds.failed, 'failed file')}" if self.holds.failed else "")
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _shorten(name: str, width: int = 30) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def main() -> None:
    run_cli(cli)


if __name__ == "__main__":
    main()
