"""The OCR workers: page images in, OCR lines out, one page at a time, each page within its own bounds.

    reader = get_ocr_pool(settings).reader(name)       # for ParserPool.parse(..., ocr=reader)
    reader(image) -> PageLines([OcrLine, ...]) | PageLeftOut(why)   (`ingest.ocr_messages`; the loaders' `PageRead`)

A parser worker that meets a scanned page renders it and hands the image up to the parent, which
passes it here. An OCR worker is a process of its own like the parser's (`ingest.sandbox`), limited to
`RAG_OCR_MEMORY_MB` of address space, run at nice 19 with onnxruntime, OpenCV and OpenMP on one thread;
the pool has `RAG_OCR_WORKERS` of them (1 by default), so a scan being indexed takes at most one core
at low priority and chats keep the other. A page over `RAG_OCR_PAGE_TIMEOUT_S` costs its worker (killed,
the next page starts a fresh one) and is left out with a warning; the rest of the document goes on.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from .loaders.ocr import OcrFn
from .ocr_messages import OcrFailed, PageImage, PageLeftOut, PageLines, PageRead
from .worker_processes import BOOT_PREFIX, READY, PoolRegistry, Worker, WorkerPool, serve_from_parent

if TYPE_CHECKING:
    from rag.core.config import Settings

log = logging.getLogger(__name__)

OCR_NICE = 19  # the lowest priority: chats, the embedder and other files go first
_BOOT = BOOT_PREFIX + "ocr_pool import ocr_worker_main; ocr_worker_main()"


def ocr_worker_main() -> None:
    """OCR worker entry point (argv as the parser worker's): lower priority, one thread, limit, serve."""
    os.nice(OCR_NICE)
    os.environ["OMP_NUM_THREADS"] = "1"
    conn = serve_from_parent()
    import cv2

    cv2.setNumThreads(1)
    from ingest.loaders.ocr import make_engine, recognize

    engine = make_engine(threads=1)
    conn.send(READY)
    while True:
        try:
            page: PageImage = conn.recv()
        except EOFError:
            return
        try:
            reply: PageLines | OcrFailed = PageLines(recognize(engine, page.image))
        except MemoryError:
            reply = OcrFailed("out of memory", memory=True)
        except Exception as exc:  # onnxruntime reports a failed allocation as a RuntimeException
            reply = OcrFailed(f"{type(exc).__name__}: {exc}")
        del page
        conn.send(reply)
        if isinstance(reply, OcrFailed):
            return


class OcrPool(WorkerPool):
    """Up to `workers` OCR processes (see the module docstring); thread-safe."""

    boot = _BOOT
    process = "OCR"
    memory_setting = "RAG_OCR_MEMORY_MB"

    def __init__(self, memory_mb: int, workers: int, page_timeout_s: float) -> None:
        super().__init__(memory_mb, max_workers=workers)
        self.page_timeout_s = page_timeout_s

    def reader(self, name: str) -> OcrFn:
        """The `ocr` function for `ParserPool.parse` on the file `name`."""
        return lambda image: self.read(image, name)

    def read(self, image: Any, name: str) -> PageRead:
        """The lines of the page `image` of the file `name`, or why it was left out; a page over its time
        or memory costs its worker (the next page gets a fresh one)."""
        worker = self._acquire()
        healthy = False
        try:
            worker.tasks += 1
            answer = self._round_trip(worker, PageImage(image))
            healthy = isinstance(answer, PageLines)
        finally:
            self._release(worker, healthy)
        if isinstance(answer, OcrFailed):
            return self._left_out(answer, name)
        return answer

    def _round_trip(self, worker: Worker, page: PageImage) -> PageLines | OcrFailed | PageLeftOut:
        started = time.monotonic()
        try:
            worker.conn.send(page)
            if not worker.conn.poll(self.page_timeout_s):
                return PageLeftOut(f"OCR did not finish within {self.page_timeout_s:g} s (RAG_OCR_PAGE_TIMEOUT_S)")
            answer: PageLines | OcrFailed = worker.conn.recv()
        except (EOFError, OSError):  # the worker died: under its limit, almost always memory
            answer = OcrFailed(f"the OCR process died after {time.monotonic() - started:.1f} s", memory=True)
        return answer

    def _left_out(self, failed: OcrFailed, name: str) -> PageLeftOut:
        if failed.memory:
            return PageLeftOut(f"OCR needed more than its {self.memory_mb} MB (RAG_OCR_MEMORY_MB)")
        log.warning("OCR failed on a page of %s: %s", name, failed.why)
        return PageLeftOut(f"OCR failed on {name} ({failed.why})")


_pools: PoolRegistry[tuple[int, int, float], OcrPool] = PoolRegistry(lambda key: OcrPool(*key))


def get_ocr_pool(settings: Settings) -> OcrPool:
    """The process-wide OCR pool for these settings (created on first use, stopped at exit)."""
    return _pools.get((settings.ocr_memory_mb, settings.ocr_workers, settings.ocr_page_timeout_s))


def close_ocr_pools() -> None:
    """Stop every OCR pool's workers (for shutdown hooks and tests)."""
    _pools.close()
