"""Shared fixtures: an isolated environment for every test, and real servers started once per session."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rag.core.config import Settings, get_settings
from tests.servers import Server, start_embedding_server, start_llama_server

# The suite embeds with the bundled all-MiniLM-L6-v2 (2.8x faster than the default multilingual-e5-small on
# this CPU); the tests of the default embedder (tests/test_e5_embedder.py, `rag up` in tests/test_launcher.py)
# ask for it. Set in every test's environment and in the environment of every process a test starts.
SUITE_EMBEDDER = "all-MiniLM-L6-v2"
os.environ["RAG_EMBED_MODEL"] = SUITE_EMBEDDER  # before any fixture: session- and module-scoped ones too
MODELS = Path(os.environ.get("RAG_CACHE_DIR") or Path.home() / ".cache" / "rag-stack") / "models"


def _clean_env(data_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAG_", "RAGSTACK_")) or k in ("RAG_LLM_SERVER_BIN", "RAG_CACHE_DIR")
    }
    env["RAG_EMBED_MODEL"] = SUITE_EMBEDDER
    env["RAG_DATA_DIR"] = str(data_dir)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every RAG_* setting is cleared and the data dir points into the test's tmp dir."""
    for key in list(os.environ):
        if key.startswith(("RAG_", "RAGSTACK_")) and key not in ("RAG_LLM_SERVER_BIN", "RAG_CACHE_DIR"):
            monkeypatch.delenv(key)
    data_dir = tmp_path / "data"
    monkeypatch.setenv("RAG_EMBED_MODEL", SUITE_EMBEDDER)
    monkeypatch.setenv("RAG_DATA_DIR", str(data_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no stray .env is read
    get_settings.cache_clear()
    yield data_dir
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("session")


@pytest.fixture(scope="session")
def generator_model(session_dir: Path) -> Path:
    from rag.deploy.modellock import ensure_bundled_generator

    return ensure_bundled_generator(Settings(data_dir=session_dir, models_dir=MODELS))


@pytest.fixture(scope="session")
def default_models_dir(session_dir: Path) -> Path:
    """The cache's models dir with the default embedder's folder rebuilt in it (once per machine), as
    `rag models prepare` leaves a user's models dir."""
    from rag.deploy.e5_rebuild import ensure_e5_model

    ensure_e5_model(Settings(data_dir=session_dir, models_dir=MODELS, embed_model="multilingual-e5-small"))
    return MODELS


@pytest.fixture(scope="session")
def llama_server(generator_model: Path, session_dir: Path) -> Iterator[Server]:
    """The real llama-server with the bundled Gemma 3 270M, one slot, 4,096 tokens."""
    server = start_llama_server(generator_model, session_dir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def instruct_model(session_dir: Path) -> Path:
    """The bundled SmolLM2 135M Instruct GGUF, read inside its package (sha256-checked against models.lock)."""
    from rag.deploy.modellock import ensure_bundled_generator

    return ensure_bundled_generator(Settings(data_dir=session_dir, generator="smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def instruct_llama_server(instruct_model: Path, session_dir: Path) -> Iterator[Server]:
    """The real llama-server with the bundled instruct model (its ChatML template, --jinja), seed 0."""
    server = start_llama_server(
        instruct_model, session_dir, profile="cpu-instruct", alias="smollm2-135m-instruct", extra=["--seed", "0"]
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def forced_llama_server(generator_model: Path, session_dir: Path) -> Iterator[Callable[..., Server]]:
    """Real llama-servers whose every reply a grammar forces to a given text (started once per text).

    The bundled base model never writes [Sn] by itself: forcing it exercises the real generation path
    (prompt, llama-server, stream, citation check) with citations that are known in advance.
    """
    servers: dict[str, Server] = {}

    def start(text: str | None = None, *, grammar: str | None = None) -> Server:
        """A server that always writes `text`, or whatever the GBNF `grammar` allows."""
        grammar = grammar or f"root ::= {json.dumps(text)}"
        if grammar not in servers:
            servers[grammar] = start_llama_server(generator_model, session_dir, extra=["--grammar", grammar])
        return servers[grammar]

    yield start
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="session")
def endless_llama(forced_llama_server: Callable[..., Server]) -> Server:
    """A real llama-server that never ends its line (a grammar with no end): only max_tokens or the client stop it.

    The bundled base model, in the completion style, stops at the end of its short answer: too soon for
    tests of what happens while a long generation runs.
    """
    return forced_llama_server(grammar='root ::= "one, two, three" more\nmore ::= ", more" more')


@pytest.fixture(scope="session")
def embedding_server(session_dir: Path) -> Iterator[Server]:
    """The real embedding server with the bundled all-MiniLM-L6-v2 (SUITE_EMBEDDER)."""
    server = start_embedding_server(session_dir, _clean_env(session_dir / "embedder-data"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL 18 with pgvector, shared by the session's tests (each takes its own database)."""
    from tests.postgres import start_postgres

    # Not under pytest's tmp dir: PostgreSQL runs as its own user when the tests run as root, and pytest's
    # folders are the test user's alone.
    directory = Path(tempfile.mkdtemp(prefix="rag-postgres-"))
    directory.chmod(0o755)
    server = start_postgres(directory / "pgdata")
    yield server
    server.cleanup()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def chroma_server(tmp_path: Path) -> Iterator[Server]:
    """A real `chroma run` server over this test's tmp dir."""
    import sys

    from tests.servers import free_port, start_server

    port = free_port()
    command = [str(Path(sys.executable).with_name("chroma")), "run", "--path", str(tmp_path / "chroma-server")]
    server = start_server(
        "chroma", [*command, "--host", "127.0.0.1", "--port", str(port)], port, tmp_path, ready_path="/api/v2/heartbeat"
    )
    yield server
    server.stop()


@pytest.fixture
def database_url(postgres_server: Any) -> str:
    """RAG_DATABASE_URL of a new, empty database on the session's PostgreSQL."""
    from tests.postgres import new_database

    return new_database(postgres_server)


@pytest.fixture
def backend_env(llama_server: Server, embedding_server: Server, isolated_env: Path) -> dict[str, str]:
    """Environment for a process of ours that uses the session's real backends and this test's data dir."""
    env = _clean_env(isolated_env)
    env["RAG_LLM_URL"] = llama_server.url
    env["RAG_EMBED_URL"] = embedding_server.url
    return env


@pytest.fixture
def backend_settings(llama_server: Server, embedding_server: Server, isolated_env: Path) -> Settings:
    return Settings(data_dir=isolated_env, llm_url=llama_server.url, embed_url=embedding_server.url)


@pytest.fixture
def ingest_env(embedding_server: Server, isolated_env: Path) -> dict[str, str]:
    """Like `backend_env` for ingestion alone: the real embedding server, no llama-server."""
    env = _clean_env(isolated_env)
    env["RAG_EMBED_URL"] = embedding_server.url
    return env


@pytest.fixture
def ingest_settings(embedding_server: Server, isolated_env: Path) -> Settings:
    """Like `backend_settings` for ingestion alone: the real embedding server, no llama-server."""
    return Settings(data_dir=isolated_env, embed_url=embedding_server.url)
