"""`rag up`: llama-server, the embedding server and the API as child processes, started and stopped together."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

from rag.core.config import Settings
from rag.core.errors import RagError
from rag.deploy.modellock import ensure_bundled_generator
from rag.deploy.placement import embedder_placement
from rag.deploy.profiles import get_profile

REPO = Path(__file__).resolve().parents[2]


class LaunchError(RagError):
    code = "launch_failed"


@dataclass
class Part:
    """One child process and how to tell that it is ready."""

    name: str
    command: list[str]
    health_url: str
    port: int
    host: str
    model: str
    log_path: Path
    ready_timeout_s: float = 180.0
    env: dict[str, str] = field(default_factory=dict)  # on top of the stack's environment
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        # Own session: a Ctrl-C reaches only us, and we stop the children in order.
        self.process = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, env={**env, **self.env}, start_new_session=True
        )
        log.close()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def llama_server_binary(settings: Settings) -> Path:
    """The configured binary, or the cached build from scripts/build-llama-server.sh (which builds if needed)."""
    if settings.llm_server_bin:
        return settings.llm_server_bin
    script = REPO / "scripts" / "build-llama-server.sh"
    if not script.exists():
        raise LaunchError("set RAG_LLM_SERVER_BIN to a llama-server binary")
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        raise LaunchError(f"building llama-server failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def plan_parts(settings: Settings) -> list[Part]:
    logs = settings.data_dir / "logs"
    llm = urlparse(settings.llm_url)
    embed = urlparse(settings.embed_url)
    model = settings.llm_model_path or ensure_bundled_generator(settings)
    profile = get_profile(settings.llm_profile)
    llm_cmd = profile.command(llama_server_binary(settings), model, llm.hostname or "127.0.0.1", settings.llm_port)
    llm_cmd += ["-a", settings.llm_model]
    if profile.threads is not None and settings.llm_threads != profile.threads:
        llm_cmd += ["-t", str(settings.llm_threads)]
    python = sys.executable
    placement = embedder_placement(settings, Path(model))
    embed_env = {"RAG_EMBED_DEVICE": placement.device} if placement.device else {}
    return [
        Part("llama-server", llm_cmd, f"{settings.llm_url}/health", settings.llm_port, llm.hostname or "127.0.0.1",
             settings.llm_model, logs / "llama-server.log"),
        Part("embedder", [python, "-m", "rag.cli", "serve-embeddings"], f"{settings.embed_url}/health",
             settings.embed_port, embed.hostname or "127.0.0.1",
             f"{settings.embed_model} on {placement.device or 'its default device'} ({placement.reason})",
             logs / "embedder.log", env=embed_env),
        Part("api", [python, "-m", "rag.cli", "serve-api"], f"{settings.api_url}/health", settings.api_port,
             settings.api_host, "-", logs / "api.log"),
    ]


def wait_ready(part: Part, others_ok: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + part.ready_timeout_s
    while time.monotonic() < deadline:
        if not part.alive():
            raise LaunchError(f"{part.name} exited during start-up; last log lines:\n{part.tail()}")
        try:
            if httpx.get(part.health_url, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise LaunchError(f"{part.name} was not ready after {part.ready_timeout_s:.0f} s; last log lines:\n{part.tail()}")


class Stack:
    """Starts the parts in order, stops them in reverse."""

    def __init__(self, parts: list[Part], echo: Callable[[str], None] = print) -> None:
        self.parts = parts
        self.echo = echo

    def check_ports(self) -> None:
        for part in self.parts:
            if not port_is_free(part.host, part.port):
                raise LaunchError(f"port {part.port} on {part.host} ({part.name}) is busy; choose another in the settings")

    def start(self) -> None:
        self.check_ports()
        env = dict(os.environ)
        try:
            for part in self.parts:
                part.start(env)
                wait_ready(part)
                self.echo(f"{part.name:<13} ready   {part.health_url.rsplit('/health', 1)[0]:<28} model {part.model}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()

    def watch(self) -> None:
        """Block until a signal arrives or a part dies; then stop everything."""
        stopping = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        try:
            while not stopping:
                dead = [p for p in self.parts if not p.alive()]
                if dead:
                    raise LaunchError(f"{dead[0].name} stopped unexpectedly; last log lines:\n{dead[0].tail()}")
                time.sleep(0.5)
        finally:
            self.stop()
