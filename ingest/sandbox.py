"""Bounded parsing: a small pool of worker processes, each under an address-space limit, with a
wall-clock timeout per file.

    pool = get_pool(settings.parse_memory_mb)
    doc = pool.parse(kind, data, name, timeout_s=settings.parse_timeout_s)

A worker is a fresh interpreter (`python -c`, importing only `ingest.sandbox` and the loaders: PDFium,
python-docx, selectolax; never torch, Chroma or the API). It sets RLIMIT_AS on itself and then serves
parse requests over a socket pair until it is retired, so a file costs one round trip of pickles, not
a process start. A worker that overruns its time is killed; one that dies (PDFium aborts when an
allocation fails under the limit) is replaced; either way the caller gets DocumentRejected and the
next file gets a fresh worker.

A worker dies with the process that started it, however that ends (SIGKILL included): a thread of its
own watches its parent and exits the moment it is gone (PR_SET_PDEATHSIG would fire when the *thread*
that started the worker ends, and the API starts them from its thread pool, whose threads come and
go). A worker that could not see it (stopped, say) is stopped by the API's next start
(`stop_orphaned_workers`).

Why not multiprocessing's forkserver or spawn: both re-import the parent's `__main__` in every child,
which re-runs a script without a `__main__` guard and drags the CLI's imports into each worker. A
subprocess with its own socket has no such coupling and no shared global state.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextvars import ContextVar
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

from rag.core import errors

from .loaders.ocr import OcrFn
from .models import DocKind, LoadedDocument
from .ocr_messages import PageImage, PageRead
from .worker_processes import BOOT_PREFIX, READY, PoolRegistry, Worker, WorkerPool, serve_from_parent

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 2
RENDER = "render-page"  # a request to render a page (`ingest.loaders.render`) rather than to parse
_BOOT = BOOT_PREFIX + "sandbox import worker_main; worker_main()"

PageProgress = Callable[[int, "int | None"], None]  # (n, total): the n-th page image of `total` goes to OCR
# Who hears of each page OCR reads in the load running in this context (`ingest.loading` passes it to
# `ParserPool.parse`): the pipeline sets it per file, so a long scan shows its pages as they are read.
page_listener: ContextVar[PageProgress | None] = ContextVar("page_listener", default=None)


def worker_main() -> None:
    """Worker entry point (argv: root, socket fd, memory MB, parent pid): limit ourselves, then serve requests."""
    conn = serve_from_parent()
    import ingest.loaders.docx  # noqa: F401  (imported up front: the first file should not pay for it)
    import ingest.loaders.html  # noqa: F401
    import ingest.loaders.pdf  # noqa: F401
    from ingest.loaders import parse
    from ingest.loaders.render import render_page

    conn.send(READY)
    while True:
        try:
            kind, data, name, options = conn.recv()
        except EOFError:
            return
        if options.pop("ocr", False):
            options["ocr"] = _OcrThrough(conn)
        try:
            result = render_page(data, **options) if kind == RENDER else parse(kind, data, name, **options)
            reply: tuple[Any, ...] = ("ok", result)
        except errors.RagError as exc:
            reply = ("error", type(exc).__name__, exc.message, exc.detail)
        except MemoryError:
            reply = ("memory",)
        except Exception as exc:  # a parser bug on a hostile file: report it, then retire
            reply = ("failed", f"{type(exc).__name__}: {exc}")
        del data
        conn.send(reply)
        if reply[0] in ("memory", "failed"):
            return


def stop_orphaned_workers(parent: int) -> list[int]:
    """SIGKILL the parser and OCR workers that process `parent` started and left behind when it died
    (a worker of a live `parent` is kept); their pids."""
    stopped = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _orphaned_worker(entry, parent):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            stopped.append(int(entry.name))
    if stopped:
        log.warning("stopped %d parser or OCR workers left by process %d: pids %s", len(stopped), parent, stopped)
    return stopped


def _orphaned_worker(proc: Path, parent: int) -> bool:
    """Whether /proc/PID is a worker of ours (by its command line) started by `parent`, now a child of another."""
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
        stat = (proc / "stat").read_text()
    except OSError:  # gone meanwhile, or not ours to read
        return False
    if len(argv) != 7 or argv[1] != b"-c" or not argv[2].startswith(BOOT_PREFIX.encode()) or argv[6] != b"%d" % parent:
        return False
    ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm) state": the command may hold spaces
    return ppid != parent


class _OcrThrough:
    """The loaders' OCR function inside a worker: each page image goes to the parent, which has it read,
    with its place among the document's pages (`expect_pages`, see `ingest.loaders.ocr.announce_pages`)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent = 0
        self.total: int | None = None

    def expect_pages(self, total: int) -> None:
        self.sent, self.total = 0, total

    def __call__(self, image: Any) -> PageRead:
        self.sent += 1
        self.conn.send(PageImage(image, self.sent, self.total))
        answer: PageRead = self.conn.recv()
        return answer


class ParserPool(WorkerPool):
    """Up to `max_workers` parser processes, each limited to `memory_mb` of address space; thread-safe."""

    boot = _BOOT
    process = "parser"
    memory_setting = "RAG_PARSE_MEMORY_MB"

    def __init__(self, memory_mb: int, max_workers: int = DEFAULT_WORKERS) -> None:
        super().__init__(memory_mb, max_workers)

    def parse(
        self,
        kind: DocKind,
        data: bytes,
        name: str,
        timeout_s: float,
        ocr: OcrFn | None = None,
        on_page: PageProgress | None = None,
        **options: Any,
    ) -> LoadedDocument:
        """`ingest.loaders.parse(kind, data, name, **options)` in a worker, within `timeout_s` seconds.

        With `ocr`, the worker's loaders may read page images by OCR: each image is passed to `ocr`,
        which answers PageLines or PageLeftOut (`ingest.ocr_messages`); its time does not count in `timeout_s`.
        `on_page(n, total)` is told before the n-th image of the document's `total` goes to `ocr`."""
        return cast(LoadedDocument, self._call(kind, data, name, timeout_s, options, ocr, on_page))

    def render(self, data: bytes, name: str, timeout_s: float, **options: Any) -> bytes:
        """`ingest.loaders.render.render_page(data, **options)` (a PNG) in a worker, within `timeout_s` seconds."""
        return cast(bytes, self._call(RENDER, data, name, timeout_s, options))

    def _call(
        self,
        kind: DocKind | str,
        data: bytes,
        name: str,
        timeout_s: float,
        options: dict[str, Any],
        ocr: OcrFn | None = None,
        on_page: PageProgress | None = None,
    ) -> Any:
        worker = self._acquire()
        healthy = False
        try:
            worker.tasks += 1
            worker.conn.send((kind, data, name, options | {"ocr": ocr is not None}))
            deadline = time.monotonic() + timeout_s
            while True:
                if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                    raise errors.DocumentRejected(f"{name} could not be parsed within {timeout_s:g} s", limit="time")
                try:
                    reply = worker.conn.recv()
                except (EOFError, ConnectionResetError):
                    raise self._died(name, worker) from None
                if not isinstance(reply, PageImage) or ocr is None:
                    break
                # A page image for the OCR worker: its time is the OCR's own bound, not the parse's.
                asked = time.monotonic()
                if on_page is not None:
                    on_page(reply.number, reply.total)
                worker.conn.send(ocr(reply.image))
                deadline += time.monotonic() - asked
            healthy = reply[0] in ("ok", "error")
            return self._unpack(reply, name)
        except (BrokenPipeError, ConnectionResetError):
            raise self._died(name, worker) from None
        finally:
            self._release(worker, healthy)

    def _died(self, name: str, worker: Worker) -> errors.DocumentRejected:
        try:
            code = worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        # PDFium aborts when an allocation fails, so a death under the limit is almost always memory.
        return errors.DocumentRejected(
            f"{name} could not be parsed within the {self.memory_mb} MB memory limit (the parser died: {how})",
            limit="memory",
        )

    def _unpack(self, reply: tuple[Any, ...], name: str) -> Any:
        status = reply[0]
        if status == "ok":
            loaded: LoadedDocument = reply[1]
            return loaded
        if status == "error":
            cls = getattr(errors, reply[1], None)
            if not (isinstance(cls, type) and issubclass(cls, errors.RagError)):
                cls = errors.DocumentRejected
            raise cls(reply[2], **reply[3])
        if status == "memory":
            raise errors.DocumentRejected(
                f"{name} could not be parsed within the {self.memory_mb} MB memory limit", limit="memory"
            )
        log.warning("parser failed on %s: %s", name, reply[1])
        raise errors.DocumentRejected(f"{name} could not be parsed ({reply[1]})")


_pools: PoolRegistry[int, ParserPool] = PoolRegistry(ParserPool)


def get_pool(memory_mb: int) -> ParserPool:
    """The process-wide pool for this memory limit (created on first use, stopped at exit)."""
    return _pools.get(memory_mb)


def close_pools() -> None:
    """Stop every pool's workers (for shutdown hooks and tests)."""
    _pools.close()
