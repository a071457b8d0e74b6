"""compose.yaml run for real: both images built, the stack brought up in podman, used, restarted, taken down and up.

The app image is docker/app.Dockerfile on a local stand-in for python:3.11-slim (Docker Hub is out of reach) and
torch from a local index standing in for PyTorch's CPU index; the llm image is docker/llm.Dockerfile's CPU
variant, which reuses the host's cached llama-server build. compose.yaml runs with docker/compose.cpu.yaml,
which swaps only the GPU and the production models. Then, on the same images plus a PostgreSQL and an
HAProxy image, docker/compose.replicas.yaml (with its CPU file) runs three API replicas on PostgreSQL behind
the balancer, under a project of its own. Timings are printed (`pytest -s`) and kept in docs/deployment.md.

Each run has its own compose project and image tags (the pid and a random part), so two copies of the suite
do not meet, and at the end it removes what it made: containers, volumes and networks (`down -v`) and every
image it built (several GB), intermediate layers included. It keeps one image on purpose: the Debian
minbase that debootstrap fetches (`BASE`, about 200 MB), reused by the next run instead of downloaded again.
"""

from __future__ import annotations

import contextlib
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
from rag.store.postgres import LIVE_TOKENS
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
POSTGRES = f"localhost/rag-test/postgres:{RUN}"  # docker/compose.replicas.yaml's rag-stack/postgres
HAPROXY = f"localhost/rag-test/haproxy:{RUN}"  # docker/compose.replicas.yaml's rag-stack/haproxy
APP_SERVICES = ("models", "embed", "chroma", "api")
SERVICES = ("llm", "embed", "chroma", "api")
REPLICAS = ("api", "api2", "api3")
REPLICA_SERVICES = ("llm", "embed", "chroma", "postgres", *REPLICAS, "balancer")
REPLICA_FILES = ("docker/compose.cpu.yaml", "docker/compose.replicas.yaml", "docker/compose.replicas-cpu.yaml")
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


def tagged_by_others() -> set[str]:
    """Images holding a tag that is not this run's: another run's, kept until that run removes them."""
    listing = podman("images", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}").stdout
    rows = [line.split(" ", 1) for line in listing.splitlines() if " " in line]
    return {image for image, name in rows if RUN not in name and not name.startswith("<none>")}


def remove_images_since(before: set[str]) -> None:
    """Remove every image made since `before` was listed (this run's tags and the untagged layers under
    them), BASE and images another run tagged meanwhile excepted (a run beside this one still needs its
    images between its stacks). An image another run's container still uses is refused by podman and stays."""
    keep = set(podman("images", "-q", "--no-trunc", BASE, check=False).stdout.split())
    for tag in (APP, LLM, POSTGRES, HAPROXY, PYTHON):
        podman("rmi", tag, check=False, timeout=300)
    new = image_ids() - before - keep - tagged_by_others()
    if new:
        podman("rmi", *sorted(new), check=False, timeout=300)
    left = image_ids() - before - keep
    print(f"\ncompose images left after the run: {len(left)}")


def image_overrides(folder: Path, replicas: bool = False) -> Path:
    """A compose file that points the services at this run's image tags (those of the replicas' stack too)."""
    path = folder / ("images-replicas.yaml" if replicas else "images.yaml")
    services = {s: {"image": APP} for s in APP_SERVICES} | {"llm": {"image": LLM}}
    text = json.dumps({"services": services})  # JSON is YAML
    if replicas:
        services |= {s: {"image": APP} for s in ("migrate", *REPLICAS)}
        services |= {"postgres": {"image": POSTGRES}, "balancer": {"image": HAPROXY}}
        # podman-compose 1.6 keeps a `!reset` only from the last file naming the service: this one, here.
        reset = {s: {**services[s], "ports": "RESET"} for s in REPLICAS[1:]}
        text = json.dumps({"services": services | reset}).replace('"RESET"', "!reset []")
    path.write_text(text)
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


def build_replica_images(timings: Timings) -> None:
    """The images docker/compose.replicas.yaml adds: PostgreSQL (from the wheel, on the python stand-in and
    the minbase) and HAProxy (Debian's, on the minbase)."""
    bases = ("--build-arg", f"PYTHON_IMAGE={PYTHON}", "--build-arg", f"RUNTIME_IMAGE={BASE}")
    timings.timed("postgres image", build, "docker/postgres.Dockerfile", POSTGRES, *bases)
    timings.timed("haproxy image", build, "docker/haproxy.Dockerfile", HAPROXY, *bases[2:])


@dataclass
class Stack:
    """compose.yaml + docker/compose.cpu.yaml under podman-compose, with the engine's health-check timer."""

    api_port: int
    timings: Timings
    images: Path  # image_overrides(): this run's tags
    stop_health: threading.Event = field(default_factory=threading.Event)
    overrides: tuple[str, ...] = ("docker/compose.cpu.yaml",)
    env: dict[str, str] = field(default_factory=dict)
    project: str = PROJECT
    services: tuple[str, ...] = SERVICES  # the long-running ones, each with a health check

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        files = [arg for name in ("compose.yaml", *self.overrides, str(self.images)) for arg in ("-f", name)]
        command = [sys.executable, "-m", "podman_compose", "-p", self.project, *files, *args]
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
        listed = podman("ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}", "--format", "json")
        return {c["Labels"]["com.docker.compose.service"]: c for c in json.loads(listed.stdout or "[]")}

    def container(self, service: str) -> str:
        return self.containers()[service]["Names"][0]

    def start_again(self, service: str, tries: int = 3) -> None:
        """`podman start` a stopped service, and again if it exits at once, as its restart policy would: these
        machines run no systemd, and a replica started right after a kill may find the network's DNS not back
        yet ("failed to resolve host 'postgres'": its API exits 1 at start)."""
        name = self.container(service)
        for _ in range(tries):
            podman("start", name)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip() != "running":
                    break  # exited: started again
                if self.health(service) == "healthy":
                    return
                time.sleep(2)
            else:
                return  # still running: wait_healthy waits for its health
        raise AssertionError(f"{service} exited each of {tries} starts:\n{self.logs()}")

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
                    if service in self.services and c["State"] == "running":
                        podman("healthcheck", "run", c["Names"][0], check=False)
            except (subprocess.SubprocessError, AssertionError, ValueError, KeyError):
                continue  # a container went away between two calls, or podman was slow: the next round retries

    def wait_healthy(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {s: self.health(s) for s in self.services}
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


@dataclass
class Built:
    """This run's images, built once for the module: both stacks run them."""

    folder: Path
    timings: Timings


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    problem = engine_problem()
    if problem:
        pytest.skip(problem)
    built = Built(tmp_path_factory.mktemp("compose"), Timings())
    before = image_ids()
    try:
        build_images(built.folder, built.timings)
        yield built
    finally:
        remove_images_since(before)
        seconds = json.dumps(built.timings.seconds)
        print(f"\ncompose timings (s): {seconds}; load {Path('/proc/loadavg').read_text().strip()}")


@contextlib.contextmanager
def running(stack: Stack, name: str) -> Iterator[Stack]:
    """`stack` up and healthy (its checks run meanwhile), then down with its volumes however the tests end."""
    health = threading.Thread(target=stack.run_health_checks, daemon=True)
    try:
        health.start()
        stack.up(name)
        yield stack
    finally:
        stack.stop_health.set()
        if health.is_alive():
            health.join(30)
        stack.compose("down", "-v", "-t", "5")  # containers, volumes and the network of this project


@pytest.fixture(scope="module")
def stack(images: Built) -> Iterator[Stack]:
    with running(Stack(free_port(), images.timings, image_overrides(images.folder)), "cold start to healthy") as up:
        yield up


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


def assert_streams_an_answer_from(url: str, question: str, source: str) -> None:
    """`question` asked at `url` streams its sources, `source` first, then some answer tokens."""
    events = chat_events(url, ask(question))
    sources = next(e.data for e in events if e.event == "sources")["sources"]
    assert sources and sources[0]["source"] == source, sources
    assert "".join(e.data["text"] for e in events if e.event == "token").strip()


def test_a_question_streams_an_answer_with_sources(stack: Stack) -> None:
    assert_streams_an_answer_from(stack.url, "How tall is the Skerryvore lighthouse tower?", DOC[0])


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


# --- docker/compose.replicas.yaml: three API replicas on PostgreSQL behind HAProxy, on the same images --------

PG_PASSWORD = uuid.uuid4().hex  # RAG_POSTGRES_PASSWORD, which the override requires
REPLICA_DOC = (
    "bell-rock.txt",
    "The Bell Rock lighthouse off the coast of Angus was built between 1807 and 1810 by Robert Stevenson. "
    "It is the oldest surviving sea-washed lighthouse in the world, its tower 35 metres tall.",
)


@pytest.fixture(scope="module")
def replicas(images: Built) -> Iterator[Stack]:
    build_replica_images(images.timings)
    stack = Stack(
        free_port(),
        images.timings,
        image_overrides(images.folder, replicas=True),
        overrides=REPLICA_FILES,
        env={"RAG_POSTGRES_PASSWORD": PG_PASSWORD},
        project=f"{PROJECT}-replicas",
        services=REPLICA_SERVICES,
    )
    with running(stack, "replicas: cold start to healthy") as up:
        yield up


def psql(stack: Stack, query: str) -> list[str]:
    """`query`'s rows (fields joined by |) from the postgres service, over its socket."""
    socket = ("-h", "/var/run/postgresql", "-U", "rag", "-d", "rag")
    done = podman("exec", stack.container("postgres"), "psql", *socket, "-At", "-c", query)
    return done.stdout.split()


def inside(stack: Stack, service: str, path: str, body: dict | None = None) -> dict:
    """GET (or POST `body` to) `path` of one replica from inside its container: it is not published."""
    code = (
        "import sys, urllib.request as u; data = sys.argv[2].encode() or None; "
        "r = u.Request('http://127.0.0.1:8000' + sys.argv[1], data=data, headers={'Content-Type': 'application/json'}); "
        "print(u.urlopen(r, timeout=240).read().decode())"
    )
    payload = json.dumps(body) if body is not None else ""
    done = podman("exec", stack.container(service), "python", "-c", code, path, payload, timeout=300)
    return json.loads(done.stdout)


def listed_sources(body: dict | list) -> list[str]:
    documents = body["documents"] if isinstance(body, dict) else body
    return [d["source"] for d in documents]


def served_by(stack: Stack, times: int) -> list[str]:
    """The replicas (HAProxy's X-Served-By) that answered `times` listings through the balancer, each 200."""
    seen = []
    for _ in range(times):
        response = httpx.get(f"{stack.url}/v1/documents", timeout=60)
        assert response.status_code == 200, response.text
        seen.append(response.headers["x-served-by"])
    return seen


def test_replicas_migrate_first_then_every_service_is_healthy(replicas: Stack) -> None:
    migrate = replicas.container("migrate")
    state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", migrate).stdout.split()
    assert state == ["exited", "0"]
    logs = podman("logs", migrate)
    assert "schema up to date" in logs.stdout + logs.stderr
    assert all(replicas.health(s) == "healthy" for s in REPLICA_SERVICES)
    versions = dict(row.split("|") for row in psql(replicas, "SELECT part, version FROM schema_versions"))
    assert {"catalog", "record", "keys", "jobs", "conversations"} <= set(versions)
    # Each replica holds its owner lease in the database (an advisory lock on its own connection).
    assert int(psql(replicas, f"SELECT count(*) FROM ({LIVE_TOKENS}) AS live")[0]) >= len(REPLICAS)
    published = {s for s, c in replicas.containers().items() if c.get("Ports")}
    assert published == {"balancer"}


def test_an_upload_through_the_balancer_is_listed_and_searched_on_every_replica(replicas: Stack) -> None:
    response = httpx.post(
        f"{replicas.url}/v1/documents",
        files=[("files", (REPLICA_DOC[0], REPLICA_DOC[1].encode(), "text/plain"))],
        timeout=300,
    )
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["status"] == "indexed", response.text
    assert psql(replicas, "SELECT count(*) FROM documents") == ["1"]
    assert sum(replicas.chroma_counts().values()) >= 1
    # Through the balancer, least connections spreads sequential requests over all three replicas.
    assert set(served_by(replicas, 6)) == {"api-1", "api-2", "api-3"}
    for service in REPLICAS:
        assert listed_sources(inside(replicas, service, "/v1/documents")) == [REPLICA_DOC[0]], service
        answer = inside(replicas, service, "/v1/chat", {**ask("Who built the Bell Rock lighthouse?"), "stream": False})
        assert answer["sources"] and answer["sources"][0]["source"] == REPLICA_DOC[0], (service, answer)


def test_a_question_through_the_balancer_streams_an_answer_with_sources(replicas: Stack) -> None:
    assert_streams_an_answer_from(replicas.url, "When was the Bell Rock lighthouse built?", REPLICA_DOC[0])


def test_with_a_replica_killed_the_balancer_still_answers(replicas: Stack) -> None:
    podman("kill", replicas.container("api2"))
    # Every request answers: HAProxy sends one that cannot reach api-2 to another replica, and marks api-2
    # down after three failed checks.
    served_by(replicas, 6)
    events = chat_events(replicas.url, ask("How tall is the Bell Rock lighthouse tower?"))
    assert next(e.data for e in events if e.event == "sources")["sources"]
    upload = httpx.post(
        f"{replicas.url}/v1/documents",
        files=[("files", ("while-one-is-down.txt", b"Written while a replica was down, then listed.", "text/plain"))],
        timeout=300,
    )
    assert upload.status_code == 200 and upload.json()["results"][0]["status"] == "indexed", upload.text
    # Started again, the replica rejoins: healthy, and the balancer sends to it again.
    replicas.start_again("api2")
    replicas.wait_healthy()
    deadline = time.monotonic() + 60
    while "api-2" not in served_by(replicas, 3):
        assert time.monotonic() < deadline, "api-2 never rejoined the balancer"
        time.sleep(2)
    assert sorted(listed_sources(inside(replicas, "api2", "/v1/documents"))) == [
        REPLICA_DOC[0],
        "while-one-is-down.txt",
    ]


def test_down_with_volumes_leaves_nothing_of_the_replicas_stack(replicas: Stack) -> None:
    replicas.compose("down", "-v", "-t", "10")
    assert not replicas.containers()
    label = f"label=com.docker.compose.project={replicas.project}"
    assert podman("volume", "ls", "-q", "--filter", label).stdout.split() == []
    assert podman("network", "ls", "-q", "--filter", label).stdout.split() == []
