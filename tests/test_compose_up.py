"""compose.yaml run for real: both images built, the stack brought up in podman, used, restarted, taken down and up.

The app image is docker/app.Dockerfile on a local stand-in for python:3.11-slim (Docker Hub is out of reach) and
torch from a local index standing in for PyTorch's CPU index; the llm image is docker/llm.Dockerfile's CPU
variant, which reuses the host's cached llama-server build. compose.yaml runs with docker/compose.cpu.yaml,
which swaps only the GPU and the production models. Timings are printed (`pytest -s`) and kept in
docs/deployment.md.

Each run has its own compose project and image tags (the pid and a random part), so two copies of the suite
do not meet, and at the end it removes what it made: containers, volumes and networks (`down -v`) and every
image it built (several GB), intermediate layers included. It keeps one image on purpose: the Debian
minbase that debootstrap fetches (`BASE`, about 200 MB), reused by the next run instead of downloaded again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from rag.deploy.modellock import load_lock
from tests.chat_helpers import ask, chat_events
from tests.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.containers, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "compose"
RUN = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
PROJECT = f"rag-stack-test-{RUN}"
BASE = "localhost/rag-test/bookworm:minbase"  # kept between runs (see the docstring)
PYTHON = f"localhost/rag-test/python:3.11-slim-{RUN}"
APP = f"localhost/rag-test/app:{RUN}"  # compose.yaml's rag-stack/app:0.1.0, under this run's tag
LLM = f"localhost/rag-test/llama-server:cpu-{RUN}"  # docker/compose.cpu.yaml's rag-stack/llama-server:b11434-cpu
APP_SERVICES = ("models", "embed", "chroma", "api")
SERVICES = ("llm", "embed", "chroma", "api")
WRONG_CHECKSUM = "tests/compose/wrong-checksum.yaml"
DOC = (
    "lighthouse.txt",
    "The Skerryvore lighthouse stands on a reef west of Tiree. It was completed in 1844 and "
    "its tower is 48 metres tall, built from granite blocks dovetailed together by Alan Stevenson.",
)


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=engine_env())
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def checked(command: list[str], timeout: float, **kwargs: object) -> None:
    done = subprocess.run(command, capture_output=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command[:4])} failed ({done.returncode}):\n{done.stderr[-3000:]!r}")


def engine_env(**extra: str) -> dict[str, str]:
    # runc and lowered rlimits: see tests/compose/containers.conf.
    return {**os.environ, "CONTAINERS_CONF": str(HERE / "containers.conf"), **extra}


def engine_problem() -> str | None:
    """Why containers cannot run on this machine, or None."""
    if not shutil.which("podman"):
        return "podman is not installed (scripts/setup.sh --test installs it)"
    if importlib.util.find_spec("podman_compose") is None:
        return "podman-compose is not installed (pip install -e '.[test]')"
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=60, env=engine_env())
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()[-300:]}"
    return None


def image_ids() -> set[str]:
    return set(podman("images", "-a", "-q", "--no-trunc").stdout.split())


def remove_images_since(before: set[str]) -> None:
    """Remove every image made since `before` was listed (this run's tags and the untagged layers under
    them), BASE excepted. An image another run's container still uses is refused by podman and stays."""
    keep = set(podman("images", "-q", "--no-trunc", BASE, check=False).stdout.split())
    for tag in (APP, LLM, PYTHON):
        podman("rmi", tag, check=False, timeout=300)
    new = image_ids() - before - keep
    if new:
        podman("rmi", *sorted(new), check=False, timeout=300)
    left = image_ids() - before - keep
    print(f"\ncompose images left after the run: {len(left)}")


def image_overrides(folder: Path) -> Path:
    """A compose file that points the services at this run's image tags."""
    path = folder / "images.yaml"
    services = {s: {"image": APP} for s in APP_SERVICES} | {"llm": {"image": LLM}}
    path.write_text(json.dumps({"services": services}))  # JSON is YAML
    return path


def base_image() -> None:
    """Debian bookworm (minbase) from Debian's own packages, imported once and kept (~40 s)."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return
    if not shutil.which("debootstrap"):
        pytest.skip("debootstrap is not installed (scripts/setup.sh --test installs it)")
    with tempfile.TemporaryDirectory(prefix="rag-rootfs-", ignore_cleanup_errors=True) as folder:
        rootfs = Path(folder)
        checked(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian"], 900)
        # This host's extra CAs (an egress proxy's), so that pip and curl inside trust what the host trusts.
        cas = rootfs / "usr/local/share/ca-certificates"
        cas.mkdir(parents=True, exist_ok=True)
        for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copy(crt, cas / crt.name)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        checked(["podman", "import", "-q", "-", BASE], 300, stdin=tar.stdout, env=engine_env())
        tar.wait()


@dataclass
class Timings:
    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = round(time.monotonic() - started, 1)


def torch_index(folder: Path) -> Path:
    """A PEP 503 index holding torch 2.13.0 (the CPU wheel that PIP_FIND_LINKS offers) and its dependencies."""
    wheels = folder / "wheels"
    # +cpu exists only in the local wheel folder: without it pip fails at once instead of fetching CUDA's GBs.
    checked([sys.executable, "-m", "pip", "download", "-q", "torch==2.13.0+cpu", "-d", str(wheels)], 900)
    index = folder / "index"
    for wheel in wheels.glob("*.whl"):
        project = index / wheel.name.split("-")[0].lower().replace("_", "-").replace(".", "-")
        project.mkdir(parents=True, exist_ok=True)
        os.link(wheel, project / wheel.name)
    return index


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class FileServer:
    """A folder over HTTP on the host: image builds (host network) reach it as 127.0.0.1."""

    def __init__(self, folder: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = partial(QuietHandler, directory=str(folder))
        try:
            self.server = ThreadingHTTPServer((host, port), handler)
        except OSError:  # taken: any port will do
            self.server = ThreadingHTTPServer((host, 0), handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def build(dockerfile: str, tag: str, *extra: str) -> None:
    podman("build", "--network", "host", "-q", "-f", dockerfile, "-t", tag, *extra, str(ROOT), timeout=3600)


def build_images(tmp: Path, timings: Timings) -> None:
    base_image()
    timings.timed("python stand-in", build, str(HERE / "python-slim.Dockerfile"), PYTHON, "--build-arg", f"BASE={BASE}")
    index = timings.timed("torch index", torch_index, tmp)
    with FileServer(index) as server:
        timings.timed(
            "app image",
            build,
            "docker/app.Dockerfile",
            APP,
            "--build-arg",
            f"PYTHON_IMAGE={PYTHON}",
            "--build-arg",
            f"TORCH_INDEX={server.url}",
        )
    cache = Path(os.environ.get("RAG_CACHE_DIR") or Path.home() / ".cache" / "rag-stack")
    cache.mkdir(parents=True, exist_ok=True)
    timings.timed(
        "llm image",
        build,
        "docker/llm.Dockerfile",
        LLM,
        "--build-arg",
        f"BUILD_IMAGE={BASE}",
        "--build-arg",
        f"RUNTIME_IMAGE={BASE}",
        "--build-arg",
        "GGML_CUDA=OFF",
        "--build-arg",
        "LLAMA_CACHE=/host-cache",
        "--volume",
        f"{cache}:/host-cache",
    )


@dataclass
class Stack:
    """compose.yaml + docker/compose.cpu.yaml under podman-compose, with the engine's health-check timer."""

    api_port: int
    timings: Timings
    images: Path  # image_overrides(): this run's tags
    stop_health: threading.Event = field(default_factory=threading.Event)
    overrides: tuple[str, ...] = ("docker/compose.cpu.yaml",)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        files = [arg for name in ("compose.yaml", *self.overrides, str(self.images)) for arg in ("-f", name)]
        command = [sys.executable, "-m", "podman_compose", "-p", PROJECT, *files, *args]
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=engine_env(RAG_PUBLISH=f"127.0.0.1:{self.api_port}", **self.env),
        )
        assert done.returncode == 0, f"podman-compose {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done

    def containers(self) -> dict[str, dict]:
        listed = podman("ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}", "--format", "json")
        return {c["Labels"]["com.docker.compose.service"]: c for c in json.loads(listed.stdout or "[]")}

    def container(self, service: str) -> str:
        return self.containers()[service]["Names"][0]

    def health(self, service: str) -> str:
        containers = self.containers()
        if service not in containers:
            return "absent"
        done = podman("inspect", "--format", "{{.State.Health.Status}}", containers[service]["Names"][0], check=False)
        return done.stdout.strip() or "unknown"

    def run_health_checks(self) -> None:
        # podman 4.3 schedules health checks with systemd timers, and these machines run no systemd: run each
        # service's own check (from compose.yaml) every 5 s, as the engine's timer would.
        while not self.stop_health.wait(5):
            try:
                for service, c in self.containers().items():
                    if service in SERVICES and c["State"] == "running":
                        podman("healthcheck", "run", c["Names"][0], check=False)
            except (subprocess.SubprocessError, AssertionError, ValueError, KeyError):
                continue  # a container went away between two calls, or podman was slow: the next round retries

    def wait_healthy(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {s: self.health(s) for s in SERVICES}
            if set(states.values()) == {"healthy"} and self.api_answers():
                return
            time.sleep(3)
        raise AssertionError(f"not all healthy after {timeout:.0f} s: {states}\n{self.logs()}")

    def api_answers(self) -> bool:
        """The published API answers /health with 200 (the check inside the container may be a round old)."""
        try:
            return httpx.get(f"{self.url}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def logs(self) -> str:
        return "\n".join(
            f"--- {s}\n" + podman("logs", "--tail", "30", c["Names"][0], check=False).stderr[-3000:]
            for s, c in self.containers().items()
        )

    def up(self, name: str) -> None:
        started = time.monotonic()
        self.compose("up", "-d", "--no-build")
        self.wait_healthy()
        self.timings.seconds[name] = round(time.monotonic() - started, 1)

    def documents(self) -> list[dict]:
        response = httpx.get(f"{self.url}/v1/documents", timeout=30)
        assert response.status_code == 200, response.text
        body = response.json()
        return body["documents"] if isinstance(body, dict) else body

    def chroma_counts(self) -> dict[str, int]:
        """Vectors per collection as the Chroma server reports them, asked from inside the api container."""
        code = (
            "import chromadb, json; c = chromadb.HttpClient(host='chroma', port=8000); "
            "print(json.dumps({x.name: x.count() for x in c.list_collections()}))"
        )
        done = podman("exec", self.container("api"), "python", "-c", code)
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    problem = engine_problem()
    if problem:
        pytest.skip(problem)
    timings = Timings()
    folder = tmp_path_factory.mktemp("compose")
    before = image_ids()
    stack = Stack(free_port(), timings, image_overrides(folder))
    health = threading.Thread(target=stack.run_health_checks, daemon=True)
    try:
        build_images(folder, timings)
        health.start()
        stack.up("cold start to healthy")
        yield stack
    finally:
        stack.stop_health.set()
        if health.is_alive():
            health.join(30)
        try:
            stack.compose("down", "-v", "-t", "5")  # containers, volumes and the network of this run's project
        finally:
            remove_images_since(before)
        print(f"\ncompose timings (s): {json.dumps(timings.seconds)}; load {Path('/proc/loadavg').read_text().strip()}")


def test_images_create_and_own_their_mount_points(stack: Stack) -> None:
    # Docker's semantics, not podman's: a fresh named volume takes the owner of the image's directory.
    done = podman("run", "--rm", "--entrypoint", "stat", APP, "-c", "%n %U %a", "/models", "/data", "/chroma")
    assert done.stdout.split("\n")[:3] == ["/models rag 755", "/data rag 755", "/chroma rag 755"], done.stdout
    assert podman("run", "--rm", APP, "id", "-un").stdout.strip() == "rag"
    sizes = {tag: podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip() for tag in (APP, LLM)}
    print(f"\nimage sizes (bytes): {sizes}")


def test_every_service_is_healthy_and_the_models_job_completed(stack: Stack) -> None:
    containers = stack.containers()
    models = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", containers["models"]["Names"][0])
    assert models.stdout.split() == ["exited", "0"]
    assert all(stack.health(s) == "healthy" for s in SERVICES)
    health = httpx.get(f"{stack.url}/health", timeout=30).json()
    assert health["status"] == "ok", health
    assert health["backends"]["store"]["mode"] == "server"
    assert health["backends"]["embedder"]["device"] == "cpu"


def test_an_uploaded_document_lands_in_the_chroma_server(stack: Stack) -> None:
    response = httpx.post(
        f"{stack.url}/v1/documents", files=[("files", (DOC[0], DOC[1].encode(), "text/plain"))], timeout=300
    )
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["status"] == "indexed", response.text
    assert sum(stack.chroma_counts().values()) >= 1
    assert [d["source"] for d in stack.documents()] == [DOC[0]]


def test_a_question_streams_an_answer_with_sources(stack: Stack) -> None:
    events = chat_events(stack.url, ask("How tall is the Skerryvore lighthouse tower?"))
    sources = next(e.data for e in events if e.event == "sources")["sources"]
    assert sources and sources[0]["source"] == DOC[0], sources
    assert "".join(e.data["text"] for e in events if e.event == "token").strip()


def test_restarting_the_api_keeps_the_documents(stack: Stack) -> None:
    stack.compose("restart", "api")
    stack.wait_healthy()
    assert [d["source"] for d in stack.documents()] == [DOC[0]]


def test_down_then_up_keeps_the_documents_in_the_volumes(stack: Stack) -> None:
    before = stack.chroma_counts()
    stack.compose("down", "-t", "10")
    assert not stack.containers()
    stack.up("warm up (down, then up) to healthy")
    assert stack.chroma_counts() == before
    assert [d["source"] for d in stack.documents()] == [DOC[0]]
    sources = next(e.data for e in chat_events(stack.url, ask("Who built Skerryvore?")) if e.event == "sources")
    assert sources["sources"], sources


def test_a_models_job_with_a_wrong_checksum_fails_and_nothing_serves(stack: Stack, tmp_path: Path) -> None:
    generator = next(a for a in load_lock() if a.role == "generator" and a.profile == "embedded")
    with (tmp_path / generator.file).open("wb") as fh:
        fh.truncate(generator.size)  # the right size, the wrong bytes
    stack.compose("down", "-v", "-t", "5")
    with FileServer(tmp_path, host="0.0.0.0") as server:
        # Containers reach the host at host.containers.internal (the compose network's gateway).
        bad = Stack(
            stack.api_port,
            stack.timings,
            stack.images,
            stack.stop_health,
            ("docker/compose.cpu.yaml", WRONG_CHECKSUM),
            {"RAG_TEST_MODEL_URL": f"http://host.containers.internal:{server.port}/{generator.file}"},
        )
        bad.compose("up", "-d", "--no-build")
        models = bad.container("models")
        podman("wait", models, timeout=300)
    state = podman("inspect", "--format", "{{.State.ExitCode}}", models).stdout.strip()
    assert state != "0"
    assert "sha256 mismatch" in podman("logs", models).stderr + podman("logs", models).stdout
    # Docker does not start the services that wait for the job; podman-compose (podman < 4.6) starts them after
    # it, without the models: none may become healthy.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = bad.containers()
        assert all(bad.health(s) != "healthy" for s in ("llm", "api") if s in running)
        time.sleep(5)
    bad.compose("down", "-v", "-t", "5")
