"""The OCR workers: page images in, OCR lines out, one page at a time, each page within its own bounds.

    reader = get_ocr_pool(settings).reader(name)       # for ParserPool.parse(..., ocr=reader)
    reader(image) -> ("lines", [OcrLine, ...]) | ("skip", why)

A parser worker that meets a scanned page renders it and hands the image up to the parent, which
passes it here. An OCR worker is a process of its own like the parser's (`ingest.sandbox`), limited to
`RAG_OCR_MEMORY_MB` of address space, run at nice 19 with onnxruntime, OpenCV and OpenMP on one thread;
the pool has `RAG_OCR_WORKERS` of them (1 by default), so a scan being indexed takes at most one core
at low priority and chats keep the other. A page over `RAG_OCR_PAGE_TIMEOUT_S` costs its worker (killed,
the next page starts a fresh one) and is left out with a warning; the rest of the document goes on.
"""

from __future__ import annotations

import atexit
import os
import resource
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from rag.core import errors

from .models import DocKind
from .sandbox import BOOT_PREFIX, ParserPool, exit_with_parent

if TYPE_CHECKING:
    from rag.core.config import Settings

OCR_NICE = 19  # the lowest priority: chats, the embedder and other files go first
_BOOT = BOOT_PREFIX + "ocr_pool import ocr_worker_main; ocr_worker_main()"


def ocr_worker_main() -> None:
    """OCR worker entry point (argv as the parser worker's): lower priority, one thread, limit, serve."""
    exit_with_parent(int(sys.argv[4]))
    conn = Connection(int(sys.argv[2]))
    limit = int(sys.argv[3]) << 20
    os.nice(OCR_NICE)
    os.environ["OMP_NUM_THREADS"] = "1"
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import cv2

    cv2.setNumThreads(1)
    from ingest.loaders.ocr import make_engine, recognize

    engine = make_engine(threads=1)
    conn.send(("ready",))
    while True:
        try:
            _, image, _, _ = conn.recv()  # the parser worker's request shape: (kind, data, name, options)
        except EOFError:
            return
        try:
            reply: tuple[Any, ...] = ("ok", recognize(engine, image))
        except MemoryError:
            reply = ("memory",)
        except Exception as exc:  # onnxruntime reports a failed allocation as a RuntimeException
            reply = ("failed", f"{type(exc).__name__}: {exc}")
        del image
        conn.send(reply)
        if reply[0] != "ok":
            return


class OcrPool(ParserPool):
    """Up to `workers` OCR processes (see the module docstring); thread-safe."""

    boot = _BOOT

    def __init__(self, memory_mb: int, workers: int, page_timeout_s: float) -> None:
        super().__init__(memory_mb, max_workers=workers)
        self.page_timeout_s = page_timeout_s

    def reader(self, name: str) -> Callable[[Any], tuple[str, Any]]:
        """The `ocr` function for `ParserPool.parse` on the file `name`."""

        def read(image: Any) -> tuple[str, Any]:
            try:
                return "lines", self.parse(DocKind.IMAGE, image, name, timeout_s=self.page_timeout_s)
            except errors.DocumentRejected as exc:
                limit = exc.detail.get("limit")
                if limit == "time":
                    return "skip", f"OCR did not finish within {self.page_timeout_s:g} s (RAG_OCR_PAGE_TIMEOUT_S)"
                if limit == "memory":
                    return "skip", f"OCR needed more than its {self.memory_mb} MB (RAG_OCR_MEMORY_MB)"
                return "skip", exc.message

        return read


_pools: dict[tuple[int, int, float], OcrPool] = {}
_pools_lock = threading.Lock()


def get_ocr_pool(settings: Settings) -> OcrPool:
    """The process-wide OCR pool for these settings (created on first use, stopped at exit)."""
    key = (settings.ocr_memory_mb, settings.ocr_workers, settings.ocr_page_timeout_s)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            if not _pools:
                atexit.register(close_ocr_pools)
            pool = _pools[key] = OcrPool(*key)
        return pool


def close_ocr_pools() -> None:
    """Stop every OCR pool's workers (for shutdown hooks and tests)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
