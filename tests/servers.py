"""Real servers for integration tests: started as subprocesses, ready on /health, stopped by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_server(
    name: str,
    command: list[str],
    port: int,
    log_dir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    ready_path: str = "/health",
) -> Server:
    log_path = log_dir / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ), start_new_session=True
        )
    server = Server(name, f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{server.log()[-3000:]}")
        try:
            if httpx.get(f"{server.url}{ready_path}", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"{name} not ready after {timeout} s:\n{server.log()[-3000:]}")


def llama_server_binary() -> str:
    if os.environ.get("RAG_LLM_SERVER_BIN"):
        return os.environ["RAG_LLM_SERVER_BIN"]
    script = Path(__file__).resolve().parent.parent / "scripts" / "build-llama-server.sh"
    # The build test-runs the binary on the bundled generator, found through this `rag` in the suite's models.
    cache = Path(os.environ.get("RAG_CACHE_DIR") or Path.home() / ".cache" / "rag-stack")
    env = {"RAG_MODELS_DIR": str(cache / "models"), **os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip().splitlines()[-1]


def start_llama_server(
    model: Path,
    log_dir: Path,
    *,
    profile: str = "cpu",
    extra: list[str] | None = None,
    alias: str = "gemma-3-270m-q4_k_m",
) -> Server:
    from rag.deploy.profiles import get_profile

    port = free_port()
    command = get_profile(profile).command(llama_server_binary(), model, "127.0.0.1", port) + ["-a", alias]
    return start_server("llama-server", command + (extra or []), port, log_dir)


def start_embedding_server(log_dir: Path, env: dict[str, str]) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "rag.cli", "serve-embeddings", "--host", "127.0.0.1", "--port", str(port)]
    return start_server("embedder", command, port, log_dir, env=env)


def start_api(log_dir: Path, env: dict[str, str], ready_path: str = "/health") -> Server:
    """The API; without llama-server its /health stays 503, so wait on another path (/v1/collections)."""
    port = free_port()
    env = {**env, "RAG_API_HOST": "127.0.0.1", "RAG_API_PORT": str(port)}
    # The API reports 503 on /health until its backends are ready: they are, in the session fixtures.
    return start_server(
        "api", [sys.executable, "-m", "rag.cli", "serve-api"], port, log_dir, env=env, ready_path=ready_path
    )
