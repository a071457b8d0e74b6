"""`rag store migrate` of a store the `ingest` command built with the real embedder, into a real PostgreSQL
18 with pgvector: with its vectors left in the data dir's Chroma, and after `rag store repair` with
RAG_VECTOR_STORE=pgvector fills pgvector from the record's vectors, every question's top 10 in each mode
(BM25, dense, hybrid) through the API's searcher is the SQLite store's, and `rag store check` finds the
store consistent with every chunk's vector where the store serves them; `rag store migrate --vectors pgvector`
does both steps in one command."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from rag.api.services import build_services
from rag.cli import cli
from rag.core.config import Settings, get_settings
from tests.chat_helpers import changed
from tests.postgres import new_database
from tests.servers import free_port

SLICE = Path(__file__).parent / "data" / "squad-v1.1-dev-slice.json"
PARAGRAPHS = 12
MODES = ("lexical", "dense", "hybrid")


def _squad(n: int) -> tuple[list[str], list[str]]:
    """The first `n` paragraphs of the SQuAD slice, and the first question of each."""
    paragraphs = [p for a in json.loads(SLICE.read_text(encoding="utf-8"))["data"] for p in a["paragraphs"]][:n]
    return [p["context"] for p in paragraphs], [p["qas"][0]["question"] for p in paragraphs]


def _top10(settings: Settings, questions: list[str]) -> dict[str, list[list[tuple[str, float]]]]:
    """Each question's top 10 (chunk id, score) per mode, through the searcher the API builds."""

    async def search() -> dict[str, list[list[tuple[str, float]]]]:
        services = build_services(settings)
        try:
            searcher = services.answerer().searcher
            return {
                mode: [
                    [
                        (h.chunk_id, h.score)
                        for h in await searcher.search(q, collection="default", k=10, mode=mode)  # type: ignore[call-arg]  # the Retriever's modes
                    ]
                    for q in questions
                ]
                for mode in MODES
            }
        finally:
            await services.aclose()

    try:
        return asyncio.run(search())
    finally:
        from chromadb.api.shared_system_client import SharedSystemClient

        SharedSystemClient.clear_system_cache()  # as a stopped API lets go of Chroma's files


def _assert_same(
    after: dict[str, list[list[tuple[str, float]]]], before: dict[str, list[list[tuple[str, float]]]]
) -> None:
    """The same chunks in the same order; the scores within what the record's float16 vectors move them."""
    for mode in MODES:
        for got, expected in zip(after[mode], before[mode], strict=True):
            assert [cid for cid, _ in got] == [cid for cid, _ in expected], mode
            assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=0.01), mode


def _rag(args: list[str], env: dict[str, str]) -> Result:
    """`rag ARGS` in a process started with `env` (the settings read anew, not this process's cached ones)."""
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
    finally:
        get_settings.cache_clear()


def _check(env: dict[str, str]) -> dict[str, object]:
    checked = _rag(["store", "check", "--json"], env)
    report: dict[str, object] = json.loads(checked.output)
    assert checked.exit_code == (0 if report["consistent"] else 1)
    return report


def test_a_migrated_store_repaired_into_pgvector_ranks_as_the_sqlite_store(
    ingest_env: dict[str, str], ingest_settings: Settings, database_url: str, postgres_server: Any, tmp_path: Path
) -> None:
    paragraphs, questions = _squad(PARAGRAPHS)
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(paragraphs):
        (folder / f"squad-{i:02d}.txt").write_text(text, encoding="utf-8")
    env = {**ingest_env, "RAG_API_PORT": str(free_port())}  # no API answers: the store directly
    subprocess.run([sys.executable, "-m", "ingest.cli", str(folder)], env=env, check=True, capture_output=True)
    before = _top10(ingest_settings, questions)
    sqlite_check = _check(env)
    assert sqlite_check["consistent"], sqlite_check
    chunks = sqlite_check["collections"][0]["catalog_chunks"]  # type: ignore[index]
    assert chunks >= PARAGRAPHS

    migrated = _rag(["store", "migrate", "--to", database_url], env)
    assert migrated.exit_code == 0, migrated.output
    assert f"copied {PARAGRAPHS} documents, {chunks} chunks in 1 collections" in migrated.output
    on_postgres = {**env, "RAG_DATABASE_URL": database_url}
    assert _check(on_postgres)["consistent"]
    _assert_same(_top10(changed(ingest_settings, database_url=database_url), questions), before)

    on_pgvector = {**on_postgres, "RAG_VECTOR_STORE": "pgvector"}
    empty = _check(on_pgvector)
    assert not empty["consistent"], empty  # pgvector is empty until the repair fills it
    repaired = _rag(["store", "repair"], on_pgvector)
    assert repaired.exit_code == 0, repaired.output
    assert f"default: {chunks} vectors in pgvector" in repaired.output
    report = _check(on_pgvector)
    assert report["consistent"] and report["vector_store"] == "pgvector", report
    (collection,) = report["collections"]  # type: ignore[misc]
    assert collection["chroma"] == collection["record_vectors"] == chunks
    pgvector = changed(ingest_settings, database_url=database_url, vector_store="pgvector")
    _assert_same(_top10(pgvector, questions), before)

    # In one command: the record copied and pgvector filled from it, into another empty database.
    second_url = new_database(postgres_server)
    at_once = _rag(["store", "migrate", "--to", second_url, "--vectors", "pgvector"], env)
    assert at_once.exit_code == 0, at_once.output
    assert f"default: {chunks} vectors in pgvector" in at_once.output
    second = {**env, "RAG_DATABASE_URL": second_url, "RAG_VECTOR_STORE": "pgvector"}
    assert _check(second)["consistent"]
    _assert_same(_top10(changed(ingest_settings, database_url=second_url, vector_store="pgvector"), questions), before)
