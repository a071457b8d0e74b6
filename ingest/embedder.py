"""An embedding server for a one-off run when none answers at RAG_EMBED_URL (the `ingest` CLI, `rag
store repair` and `rag store reindex`): the same server as `rag up` starts (`rag serve-embeddings`,
the same model, device, threads and batching from the same settings), run as this process's child on
a free local port and stopped when the run ends; it dies with this process, however that ends. Its log is `$RAG_DATA_DIR/logs/<run>-embedder.log`.

A child rather than the model in-process: the run then embeds exactly as the stack does (the server's
micro-batching and thread settings), and nothing of the embedding server is imported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx

from rag.core.config import Settings
from rag.core.errors import EmbedderUnavailable
from rag.core.lifetime import die_with_parent

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0


async def embedder_answers(url: str) -> bool:
    """Whether an embedding server answers at `url` (ready or still loading its model)."""
    try:
        async with httpx.AsyncClient(timeout=3.0) as client:
            response = await client.get(f"{url}/health")
    except httpx.TransportError:
        return False
    return response.status_code in (200, 503)


@contextlib.asynccontextmanager
async def embedder_for(settings: Settings, say: Callable[[str], None], run: str = "ingest") -> AsyncIterator[Settings]:
    """`settings` whose embed_url answers: the configured server, or a child started for this `run`."""
    for url in settings.embed_urls:  # a pool answers when one of its servers does
        if await embedder_answers(url):
            yield settings
            return
    port = _free_port()
    log_path = settings.data_dir / "logs" / f"{run.removeprefix('rag ').replace(' ', '-')}-embedder.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(
        f"no embedding server answers at {settings.embed_url}: starting one for this run "
        f"({settings.embed_model}, log {log_path})"
    )
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rag.cli",
            "serve-embeddings",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=die_with_parent(),  # a killed ingest leaves no orphan server holding the model
        )
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_ready(url, process, log_path, run)
        say(f"embedding server ready in {time.monotonic() - started:.1f} s")
        yield settings.model_copy(update={"embed_url": url})
    finally:
        await _stop(process)


async def _wait_ready(url: str, process: asyncio.subprocess.Process, log_path: Path, run: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with httpx.AsyncClient(timeout=3.0) as client:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise EmbedderUnavailable(
                    f"the embedding server started for {run} exited ({process.returncode}): "
                    f"{_last_line(log_path)} (see {log_path})"
                )
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            await asyncio.sleep(0.25)
    raise EmbedderUnavailable(
        f"the embedding server started for {run} was not ready in {START_TIMEOUT_S:.0f} s (see {log_path})"
    )


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
