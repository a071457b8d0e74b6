"""kill -9 of the CLI or the API in the middle of a batch, then a re-run: exactly the input's documents,
each once, no orphan chunks (chunks per document id in Chroma and in the lexical index, against what
chunking produces)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from rag.core.config import Settings
from tests import hostile
from tests.crash_points import ingest_command, reap, spawn
from tests.data import SQUAD
from tests.ingest_helpers import census, expected_chunks
from tests.servers import Server, free_port, start_api

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def write_corpus(folder: Path, version: str = "") -> list[Path]:
    """80 SQuAD paragraphs as text files (a chunk or two each) and 3 PDFs of several chunks."""
    folder.mkdir(parents=True, exist_ok=True)
    squad = json.loads(SQUAD.read_text())
    contexts = [p["context"] for article in squad["data"][:6] for p in article["paragraphs"]][:80]
    paths = []
    for i, text in enumerate(contexts):
        path = folder / f"squad-{i:03d}.txt"
        path.write_text(f"{version}{text}")
        paths.append(path)
    for i in range(3):
        pages = [
            [latin1(f"{version}Report {i} page {p} line {n}: " + contexts[(p + n) % 80][:80]) for n in range(12)]
            for p in range(4)
        ]
        path = folder / f"report-{i}.pdf"
        path.write_bytes(hostile.text_pdf(pages))
        paths.append(path)
    return paths


def latin1(text: str) -> str:
    """What the test PDF writer can set in Helvetica."""
    return text.encode("latin-1", errors="replace").decode("latin-1")


def states(data_dir: Path, since: float = 0.0) -> dict[str, int]:
    """Documents per state (indexed ones: only those indexed after `since`), read as another process would."""
    path = data_dir / "catalog.sqlite"
    if not path.exists():
        return {}
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            return dict(
                db.execute(
                    "SELECT state, count(*) FROM documents WHERE state != 'indexed' OR indexed_at >= ? GROUP BY state",
                    (since,),
                ).fetchall()
            )
    except sqlite3.OperationalError:
        return {}


def kill_when(process: subprocess.Popen, data_dir: Path, indexed: int, timeout: float = 240) -> dict[str, int]:
    """SIGKILL `process` once it made `indexed` documents searchable and others are pending (mid-batch)."""
    started = time.time()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = states(data_dir, since=started)
        if now.get("indexed", 0) >= indexed and now.get("pending", 0):
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            return now
        assert process.poll() is None, f"finished before it could be killed: {now}"
        time.sleep(0.02)
    raise AssertionError(f"no progress to interrupt: {states(data_dir)}")


def assert_exact(data_dir: Path, paths: list[Path]) -> None:
    seen = census(data_dir, "default")
    assert seen.consistent(), seen
    assert set(seen.states.values()) == {"indexed"}, seen.states
    assert seen.indexed() == expected_chunks(paths, Settings(data_dir=data_dir))


@pytest.mark.parametrize("new_versions", [False, True], ids=["fresh", "new-versions"])
def test_kill_the_cli_mid_batch_then_rerun(
    ingest_env: dict[str, str], tmp_path: Path, isolated_env: Path, new_versions: bool
) -> None:
    env = {**ingest_env, "RAG_API_PORT": str(free_port()), "RAG_EMBED_BATCH": "16"}
    corpus = tmp_path / "corpus"
    paths = write_corpus(corpus)
    log = tmp_path / "ingest.log"
    if new_versions:  # everything indexed once, then every file changes: the kill hits version switches
        subprocess.run(ingest_command(str(corpus)), env=env, check=True, capture_output=True, timeout=600)
        paths = write_corpus(corpus, version="Revised. ")
    for target in (5, 30):  # two interruptions at different depths
        process = spawn(ingest_command(str(corpus)), env, log)
        try:
            kill_when(process, isolated_env, indexed=target)
        finally:
            reap(process)
    done = subprocess.run(ingest_command(str(corpus), "--json"), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + log.read_text()
    summary = json.loads(done.stdout)
    assert summary["files"]["failed"] == 0 and summary["files"]["indexed"] + summary["files"]["unchanged"] == len(paths)
    assert_exact(isolated_env, paths)


def test_kill_the_api_mid_batch_then_restart_and_rerun(
    ingest_env: dict[str, str], tmp_path: Path, isolated_env: Path
) -> None:
    corpus = tmp_path / "corpus"
    paths = write_corpus(corpus)
    api_env = {**ingest_env, "RAG_EMBED_BATCH": "16"}
    api: Server = start_api(tmp_path, api_env, ready_path="/v1/collections")
    try:
        cli = spawn(ingest_command(str(corpus), "--server", api.url), ingest_env, tmp_path / "ingest.log")
        try:
            kill_when(api.process, isolated_env, indexed=10)
            assert cli.wait(60) == 1  # the CLI reports the API gone
        finally:
            reap(cli)
    finally:
        api.stop()
    assert "pending" in states(isolated_env)  # the kill left half-indexed documents
    api = start_api(tmp_path, api_env, ready_path="/v1/collections")  # recovery runs at start-up
    try:
        assert "pending" not in states(isolated_env)
        done = subprocess.run(
            ingest_command(str(corpus), "--server", api.url, "--json"),
            env=ingest_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
    finally:
        api.stop()
    assert_exact(isolated_env, paths)
