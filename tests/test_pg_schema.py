"""`rag db upgrade`: every part's PostgreSQL tables made before the replicas start (compose's `migrate`),
on a real PostgreSQL 18 with pgvector."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from rag.cli import cli, schema_parts
from rag.core.config import get_settings
from rag.core.errors import StoreTooNew, StoreUnavailable
from rag.store.pg_catalog import PgDocumentCatalog
from tests.servers import free_port

pytestmark = pytest.mark.integration
PARTS = schema_parts(pgvector=False)
VECTORS = schema_parts(pgvector=True)[-1]


def upgrade(url: str, *args: str, **env: str) -> Result:
    get_settings.cache_clear()
    return CliRunner().invoke(cli, ["db", "upgrade", *args], env={"RAG_DATABASE_URL": url, **env})


def versions(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT part, version FROM schema_versions").fetchall())


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {name for (name,) in rows}


def test_an_empty_database_gets_every_part_at_its_latest_version(database_url: str) -> None:
    done = upgrade(database_url)
    assert done.exit_code == 0, done.output
    assert "schema up to date" in done.output
    assert versions(database_url) == {part: len(steps) for part, steps in PARTS}
    assert {"documents", "chunks", "api_keys", "upload_jobs", "sent_sources", "owners"} <= tables(database_url)
    assert "vector_collections" not in tables(database_url)  # Chroma holds the vectors unless told otherwise


def test_a_second_upgrade_changes_nothing_and_a_replica_opens_the_same_versions(database_url: str) -> None:
    assert upgrade(database_url).exit_code == 0
    before = versions(database_url)
    again = upgrade(database_url)
    assert again.exit_code == 0, again.output
    PgDocumentCatalog(database_url).close()  # what a replica opens first
    assert versions(database_url) == before


def test_with_pgvector_the_vector_tables_are_made_too(database_url: str) -> None:
    done = upgrade(database_url, RAG_VECTOR_STORE="pgvector")
    assert done.exit_code == 0, done.output
    assert versions(database_url)[VECTORS[0]] == len(VECTORS[1])
    assert "vector_collections" in tables(database_url)


def test_a_database_newer_than_the_code_is_refused_with_both_versions(database_url: str) -> None:
    assert upgrade(database_url).exit_code == 0
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE schema_versions SET version = 99 WHERE part = 'catalog'")
    refused = upgrade(database_url)
    assert isinstance(refused.exception, StoreTooNew)
    assert "catalog schema version 99" in str(refused.exception)
    assert f"({len(PARTS[0][1])})" in str(refused.exception)


def test_an_unreachable_server_is_waited_for_then_named_without_its_password(tmp_path: Any) -> None:
    url = f"postgresql://rag:secret-word@127.0.0.1:{free_port()}/rag"
    refused = upgrade(url, "--wait", "2")
    assert isinstance(refused.exception, StoreUnavailable)
    assert "secret-word" not in str(refused.exception) and "127.0.0.1" in str(refused.exception)
    assert "waiting for the database" in refused.output  # it tried again meanwhile


def test_without_a_database_url_it_says_so() -> None:
    get_settings.cache_clear()
    done = CliRunner().invoke(cli, ["db", "upgrade"])
    assert done.exit_code == 2
    assert "RAG_DATABASE_URL is not set" in done.output
