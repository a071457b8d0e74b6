"""Worker processes under a memory limit, started on demand and reused: what the parser pool
(`ingest.sandbox`) and the OCR pool (`ingest.ocr_pool`) share.

    class ParserPool(WorkerPool):
        boot = BOOT_PREFIX + "sandbox import worker_main; worker_main()"
        process, memory_setting = "parser", "RAG_PARSE_MEMORY_MB"

A worker is a fresh interpreter started as `python -c BOOT root fd memory_mb parent_pid`: its side calls
`serve_from_parent()` (exit with the parent, limit its address space, take the socket) and sends READY,
then answers requests over the socket pair until it is retired. A pool keeps up to `max_workers` of
them, hands one to one caller at a time (`_acquire`, `_release`) and replaces one that died or served
`MAX_TASKS_PER_WORKER` requests. What a request and its answer are is each pool's own. A `PoolRegistry`
holds a process's pools of one kind, one per set of limits.
"""

from __future__ import annotations

import atexit
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Generic, TypeVar

from rag.core import errors

MAX_TASKS_PER_WORKER = 200  # then a fresh worker, so heap fragmentation never adds up
START_TIMEOUT_S = 60.0
ROOT = str(Path(__file__).resolve().parents[1])  # the directory holding the ingest and rag packages
# A worker's command line is `python -c BOOT root fd memory_mb parent_pid`, BOOT starting with this.
BOOT_PREFIX = "import sys; sys.path.insert(0, sys.argv[1]); from ingest."
READY = ("ready",)  # a worker's first message: it is limited and serves
_PARENT_CHECK_S = 0.2
K = TypeVar("K", bound=Hashable)
P = TypeVar("P", bound="WorkerPool")


def serve_from_parent() -> Connection:
    """In a worker (argv: root, socket fd, memory MB, parent pid): exit with the parent, limit this
    process's address space, no core files; the socket to the parent."""
    exit_with_parent(int(sys.argv[4]))
    limit = int(sys.argv[3]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a PDFium abort should not write a core file
    return Connection(int(sys.argv[2]))


def exit_with_parent(parent: int) -> None:
    """In a worker: end this process as soon as `parent` is no longer its parent (it died)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_S)
        os._exit(1)  # no clean-up to wait for: the parent that wanted the answer is gone

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@dataclass
class Worker:
    """One worker process and the parent's end of its socket."""

    process: subprocess.Popen[bytes]
    conn: Connection
    tasks: int = 0

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        self.conn.close()
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)


class WorkerPool:
    """Up to `max_workers` worker processes running `boot`, each limited to `memory_mb`; thread-safe."""

    boot: str  # the worker's entry point, BOOT_PREFIX + "module import main; main()"
    process = "worker"  # what a worker is called in messages
    memory_setting = ""  # the setting that gives `memory_mb`, named when a worker cannot start

    def __init__(self, memory_mb: int, max_workers: int) -> None:
        self.memory_mb = memory_mb
        self.max_workers = max_workers
        self._idle: list[Worker] = []
        self._count = 0
        self._closed = False
        self._cond = threading.Condition()

    def warm(self) -> None:
        """Start one worker now, so the first request does not wait for it."""
        self._release(self._acquire(), healthy=True)

    def close(self) -> None:
        """Stop the idle workers now and busy ones when they finish."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for worker in idle:
            worker.stop()

    def _acquire(self) -> Worker:
        with self._cond:
            while True:
                while not self._idle and self._count >= self.max_workers:
                    self._cond.wait()
                if not self._idle:
                    self._count += 1
                    break
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                self._count -= 1  # died while idle (the OOM killer?): forget it and look again
                worker.stop()
        try:
            return self._start()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _start(self) -> Worker:
        ours, theirs = socket.socketpair()
        with theirs:
            fd = theirs.fileno()
            process = subprocess.Popen(
                [sys.executable, "-c", self.boot, ROOT, str(fd), str(self.memory_mb), str(os.getpid())],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        worker = Worker(process, Connection(ours.detach()))
        try:
            if not worker.conn.poll(START_TIMEOUT_S) or worker.conn.recv() != READY:
                raise EOFError
        except (EOFError, OSError):
            worker.stop()
            # Not the file's fault: the service is misconfigured (its memory setting too low?) or broken.
            raise errors.RagError(
                f"the {self.process} process did not start within its {self.memory_mb} MB memory limit"
                f" ({self.memory_setting} too low?)"
            ) from None
        return worker

    def _release(self, worker: Worker, healthy: bool) -> None:
        keep = healthy and worker.tasks < MAX_TASKS_PER_WORKER and worker.alive()
        with self._cond:
            if keep and not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            self._count -= 1
            self._cond.notify()
        worker.stop()


class PoolRegistry(Generic[K, P]):
    """The process-wide pools of one kind, one per `key` (the limits they were made with): made by `make`
    on first use, all stopped at exit; thread-safe."""

    def __init__(self, make: Callable[[K], P]) -> None:
        self._make = make
        self._pools: dict[K, P] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> P:
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                if not self._pools:
                    atexit.register(self.close)
                pool = self._pools[key] = self._make(key)
            return pool

    def close(self) -> None:
        """Stop every pool's workers (for shutdown hooks and tests)."""
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.close()
