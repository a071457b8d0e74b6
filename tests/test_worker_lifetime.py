"""The API's parser and OCR workers never outlive it: a real API (a process of its own, with the real
embedding server) is killed with SIGKILL while its workers read a scan by OCR, and none is left; a worker
that could not see its parent die (stopped) is stopped by the next start."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from ingest.sandbox import ParserPool, stop_orphaned_workers
from tests import scans
from tests.servers import Server, start_api

pytestmark = pytest.mark.integration

PAGE = (
    "The lighthouse of Korsvik was lit in 1871. Its lamp burned colza oil until 1902 and could be seen "
    "from nineteen nautical miles on a clear night."
)


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
    return found


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_ocr_worker(api: Server, timeout_s: float = 120) -> dict[int, str]:
    """The API's workers once one of them is an OCR worker (a scan's page is being read)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = {pid: line for pid, line in _children(api.pid).items() if "worker_main" in line}
        if any("ocr_worker_main" in line for line in workers.values()):
            return workers
        time.sleep(0.1)
    raise AssertionError(f"no OCR worker started within {timeout_s} s:\n{api.log()[-2000:]}")


def _upload_in_background(url: str, pages: int) -> None:
    """A scan of full pages (each takes its OCR worker many seconds), uploaded by a thread."""
    scan = scans.image_pdf([scans.scanned(scans.render_page([PAGE] * 12), seed=i) for i in range(pages)])

    def post() -> None:
        try:
            httpx.post(f"{url}/v1/documents", files=[("files", ("korsvik.pdf", scan, "application/pdf"))], timeout=300)
        except httpx.TransportError:
            pass  # the API is killed under it

    threading.Thread(target=post, daemon=True).start()


def _kill(api: Server) -> None:
    os.kill(api.pid, signal.SIGKILL)
    api.process.wait()


def test_killing_the_api_during_an_ocr_ingest_leaves_no_worker(ingest_env: dict[str, str], tmp_path: Path) -> None:
    api = start_api(tmp_path, ingest_env, ready_path="/v1/collections")
    try:
        _upload_in_background(api.url, pages=3)
        workers = _wait_for_ocr_worker(api)
        time.sleep(3.0)  # the OCR worker has loaded its models and is inside a page now
        _kill(api)
        deadline = time.monotonic() + 5  # they go within a fraction of a second; 5 s for a loaded machine
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {pid: line for pid, line in workers.items() if _running(pid)}
        assert not left, f"workers outlived the API: {left}"
    finally:
        api.stop()


def test_a_start_stops_the_workers_a_killed_api_left(ingest_env: dict[str, str], tmp_path: Path) -> None:
    api = start_api(tmp_path, ingest_env, ready_path="/v1/collections")
    workers: dict[int, str] = {}
    try:
        _upload_in_background(api.url, pages=2)
        workers = _wait_for_ocr_worker(api)
        for pid in workers:  # stopped, a worker cannot see its parent die: only a start can end it
            os.kill(pid, signal.SIGSTOP)
        _kill(api)
        time.sleep(1.0)
        assert all(_running(pid) for pid in workers)
        again = start_api(tmp_path, ingest_env, ready_path="/v1/collections")
        try:
            deadline = time.monotonic() + 10
            while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [pid for pid in workers if _running(pid)], "the start left the old workers running"
            assert f"parser or OCR workers left by process {api.pid}" in again.log()
        finally:
            again.stop()
    finally:
        api.stop()
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_sweep_keeps_the_workers_of_a_live_parent() -> None:
    pool = ParserPool(memory_mb=512, max_workers=1)
    try:
        pool.warm()
        assert stop_orphaned_workers(os.getpid()) == []
        assert all(_running(w.process.pid) for w in pool._idle) and pool._idle
    finally:
        pool.close()
