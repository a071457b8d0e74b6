"""`rag up`: llama-server, the embedding server and the API as child processes, started and stopped together."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from rag.core.config import Settings
from rag.core.errors import RagError
from rag.core.lifetime import die_with_parent
from rag.deploy import exits
from rag.deploy.e5_rebuild import ensure_embedder
from rag.deploy.llm_servers import llm_servers
from rag.deploy.modellock import ensure_bundled_generator
from rag.deploy.placement import embedder_placement
from rag.deploy.profiles import get_profile
from rag.deploy.runlogs import new_run_dir

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
    stop_timeout_s: float = 10.0  # after SIGTERM, before SIGKILL
    env: dict[str, str] = field(default_factory=dict)  # on top of the stack's environment
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        # Own session and process group: a Ctrl-C reaches only us, we stop the children in order, and
        # a stop reaches a child's own children too. The death signal covers the case where we cannot
        # stop anything (rag up killed with SIGKILL).
        self.process = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**env, **self.env},
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        log.close()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float | None = None) -> None:
        timeout = self.stop_timeout_s if timeout is None else timeout
        if self.process is None:
            return
        if self.alive():
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                return
        stop_group(self.process.pid, grace_s=0)  # whatever the child left behind in its group
        self.process.wait()

    def ended(self, when: str = "") -> str:
        """How the process ended, with the remedy where one is known: 'llama-server was killed by SIGILL ...'."""
        return exits.ended(self.name, self.process.returncode if self.process is not None else None, when)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def group_members(pgid: int) -> list[int]:
    """Live processes in process group `pgid` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def stop_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM every process of a group, then SIGKILL what is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_members(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


class PidFile:
    """The process groups `rag up` started, so that the next start stops any it left behind.

    A process group id cannot be reused while any process of the group lives, so stopping the
    recorded groups that still have members stops only what we started.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def leftovers(self) -> list[int]:
        try:
            recorded = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        if _alive(recorded.get("supervisor", 0)):
            raise LaunchError(f"rag up is already running (pid {recorded['supervisor']}); stop it first")
        return [g for g in recorded.get("groups", []) if isinstance(g, int) and group_members(g)]

    def write(self, groups: list[int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"supervisor": os.getpid(), "groups": groups}))
        tmp.replace(self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def llama_server_binary(settings: Settings) -> Path:
    """The configured binary, or the cached build from scripts/build-llama-server.sh (which builds if needed,
    and test-runs the binary on the bundled model through this Python's `rag`)."""
    if settings.llm_server_bin:
        return settings.llm_server_bin
    script = REPO / "scripts" / "build-llama-server.sh"
    if not script.exists():
        raise LaunchError("set RAG_LLM_SERVER_BIN to a llama-server binary")
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
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


# The API gets its shutdown grace (uploads being indexed finish or roll back) plus this, to close.
API_STOP_MARGIN_S = 10.0

# The setting that moves each part's port, for the busy-port error.
PORT_SETTINGS = {"llama-server": "RAG_LLM_URL", "embedder": "RAG_EMBED_URL", "api": "RAG_API_PORT"}


def plan_parts(settings: Settings) -> list[Part]:
    logs = new_run_dir(settings.data_dir / "logs")
    embed_url = settings.embed_urls[0]  # the one `rag up` starts; the others of a pool run elsewhere
    embed = urlparse(embed_url)
    model = settings.llm_model_path or ensure_bundled_generator(settings)
    ensure_embedder(settings, print)  # sha256 against models.lock first: another file stops the start
    profile = get_profile(settings.llm_profile)
    binary = llama_server_binary(settings)
    python = sys.executable
    placement = embedder_placement(settings, Path(model))
    embed_env = {"RAG_EMBED_DEVICE": placement.device} if placement.device else {}
    llm_parts = []
    for server in llm_servers(settings, on_gpu=profile.gpu_layers is not None):
        command = [*profile.command(binary, model, server.host, server.port), "-a", settings.llm_model]
        if profile.threads is not None and settings.llm_threads != profile.threads:
            command += ["-t", str(settings.llm_threads)]
        where = f", GPU {server.env['CUDA_VISIBLE_DEVICES']}" if server.env else ""
        llm_parts.append(
            Part(
                server.name,
                command,
                f"{server.url}/health",
                server.port,
                server.host,
                f"{settings.llm_model} (profile {profile.name}{where})",
                logs / f"{server.name}.log",
                env=server.env,
            )
        )
    return [
        *llm_parts,
        Part(
            "embedder",
            [python, "-m", "rag.cli", "serve-embeddings"],
            f"{embed_url}/health",
            settings.embed_port,
            embed.hostname or "127.0.0.1",
            # {device}: what the server chose, from its /health (the placement may leave the choice to it)
            f"{settings.embed_model} on {{device}} ({placement.reason})",
            logs / "embedder.log",
            env=embed_env,
        ),
        Part(
            "api",
            [python, "-m", "rag.cli", "serve-api"],
            f"{settings.api_url}/health",
            settings.api_port,
            settings.api_host,
            f"web page and API over {settings.data_dir}",
            logs / "api.log",
            stop_timeout_s=settings.shutdown_grace_s + API_STOP_MARGIN_S,
        ),
    ]


def wait_ready(part: Part) -> dict[str, Any]:
    """The part's /health body once it answers 200 (an empty dict for a body that is not a JSON object)."""
    deadline = time.monotonic() + part.ready_timeout_s
    while time.monotonic() < deadline:
        if not part.alive():
            raise LaunchError(f"{part.ended(' during start-up')}; last log lines:\n{part.tail()}")
        try:
            response = httpx.get(part.health_url, timeout=2.0)
            if response.status_code == 200:
                return _json_object(response)
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise LaunchError(f"{part.name} was not ready after {part.ready_timeout_s:.0f} s; last log lines:\n{part.tail()}")


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def ready_text(part: Part, health: dict[str, Any]) -> str:
    """What the ready line says of a part: its `model` text with `{key}` filled from its /health."""
    text = part.model
    for key, value in health.items():
        if isinstance(value, str | int | float):
            text = text.replace(f"{{{key}}}", str(value))
    return text


class Stopped(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived: stop everything, whatever we were doing."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """From now on a stop signal raises `Stopped` wherever the main thread is (a build, a start, a wait)."""

    def raise_stopped(signum: int, frame: object) -> None:
        raise Stopped(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_stopped)


def _hold_signals() -> None:
    # While stopping, a second Ctrl-C must not cut the stop short and leave children behind.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)


@dataclass
class RestartPolicy:
    """Backoff between restarts of a part that died; too many in a row stop the stack."""

    max_restarts: int = 5
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    stable_after_s: float = 60.0  # a part up this long has recovered: its count starts again

    def delay(self, restarts: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2.0 ** max(0, restarts - 1))


class Stack:
    """Starts the parts in order, restarts one that dies, stops them in reverse."""

    def __init__(
        self,
        parts: list[Part],
        echo: Callable[[str], None] = print,
        pid_file: Path | None = None,
        policy: RestartPolicy | None = None,
    ) -> None:
        self.parts = parts
        self.echo = echo
        self.pid_file = PidFile(pid_file) if pid_file else None
        self.policy = policy or RestartPolicy()
        self.env = dict(os.environ)

    def check_ports(self) -> None:
        for part in self.parts:
            if not port_is_free(part.host, part.port):
                setting = PORT_SETTINGS.get(
                    part.name.rsplit("-", 1)[0] if part.name[-1].isdigit() else part.name, "the settings"
                )
                raise LaunchError(
                    f"port {part.port} on {part.host} ({part.name}) is busy: stop what listens there, "
                    f"or choose another port with {setting}"
                )

    def clean_leftovers(self) -> None:
        """Stops what a previous rag up that was killed left running (before the ports are checked)."""
        if self.pid_file is None:
            return
        for pgid in self.pid_file.leftovers():
            self.echo(f"stopping process group {pgid} left by a previous rag up")
            stop_group(pgid)
        self.pid_file.remove()

    def start(self) -> None:
        try:
            self.clean_leftovers()
            self.check_ports()
            for part in self.parts:
                self._start(part)
                health = wait_ready(part)
                self.echo(
                    f"{part.name:<13} ready   {part.health_url.rsplit('/health', 1)[0]:<28} {ready_text(part, health)}"
                )
        except BaseException:
            self.stop()
            raise

    def _start(self, part: Part) -> None:
        part.start(self.env)
        if self.pid_file is not None:
            self.pid_file.write([p.process.pid for p in self.parts if p.process is not None])

    def stop(self) -> None:
        _hold_signals()
        for part in reversed(self.parts):
            part.stop()
        if self.pid_file is not None:
            self.pid_file.remove()

    def watch(self, poll_s: float = 0.5) -> None:
        """Until a stop signal: restart a part that dies (with backoff); too many crashes stop everything."""
        restarts = {part.name: 0 for part in self.parts}
        up_since = {part.name: time.monotonic() for part in self.parts}
        try:
            while True:
                for part in self.parts:
                    if part.alive():
                        if time.monotonic() - up_since[part.name] > self.policy.stable_after_s:
                            restarts[part.name] = 0
                        continue
                    restarts[part.name] += 1
                    self._recover(part, restarts[part.name])
                    up_since[part.name] = time.monotonic()
                time.sleep(poll_s)
        finally:
            self.stop()

    def _recover(self, part: Part, attempt: int) -> None:
        if attempt > self.policy.max_restarts:
            raise LaunchError(
                f"{part.name} crashed {attempt} times in a row (last: {part.ended()}); stopping. "
                f"Last log lines:\n{part.tail()}"
            )
        delay = self.policy.delay(attempt)
        self.echo(f"{part.ended()}; restarting in {delay:g} s (restart {attempt} of {self.policy.max_restarts})")
        time.sleep(delay)
        began = time.monotonic()
        part.stop()  # anything the dead child left in its process group
        self._start(part)
        try:
            wait_ready(part)
        except LaunchError as exc:
            self.echo(f"{part.name} did not come back: {exc.message.splitlines()[0]}")
            return  # still dead: the next round counts another crash
        self.echo(f"{part.name} ready again after {time.monotonic() - began:.1f} s")
