"""docker/compose.replicas.yaml checked statically: three API replicas on PostgreSQL behind HAProxy.

The files are merged here as Docker Compose merges them (each file's `extends` resolved before it is merged,
mappings merged, `!reset` removing, `${VAR:-default}` and `${VAR:?error}` interpolated), then checked against
the Compose schema, our settings and the balancer's rules. tests/test_compose_up.py runs the merged stack in
podman.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from click.testing import CliRunner

from rag.cli import cli
from rag.core.config import Settings
from rag.deploy.balancer import haproxy_config
from tests.test_compose import COMPOSE, ROOT, ComposeLoader, environment, named_volumes

DOCKER = ROOT / "docker"
PRODUCTION = ("docker/compose.replicas.yaml",)
CPU = ("docker/compose.cpu.yaml", "docker/compose.replicas.yaml", "docker/compose.replicas-cpu.yaml")
REPLICAS = ("api", "api2", "api3")
ONE_SHOT = {"models", "migrate"}
ENV = {"RAG_POSTGRES_PASSWORD": "0123456789abcdef"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def seconds(duration: str) -> float:
    return float(duration.removesuffix("s"))


def load(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=ComposeLoader)


def merge(base: Any, over: Any) -> Any:
    """The Compose merge: mappings merged key by key, `!reset` removing the key, anything else replacing."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if value == "!reset":
                out.pop(key, None)
            else:
                out[key] = merge(base[key], value) if key in base else value
        return out
    return over


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """`${VAR}`, `${VAR:-default}` and `${VAR:?error}` from `env` (an unset required one fails), `$$` a `$`."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise AssertionError(f"{name} is required: {rest}")
        return rest if kind == "-" else ""

    return _VARIABLE.sub(one, value.replace("$$", "\0")).replace("\0", "$")


def merged(files: tuple[str, ...], env: dict[str, str] = ENV) -> dict[str, Any]:
    """compose.yaml with `files` over it, in order, as Docker Compose reads them."""
    model = yaml.safe_load(COMPOSE.read_text())
    for name in files:
        path = ROOT / name
        top = load(path)
        for service_name, service in top.get("services", {}).items():
            if "extends" in service:  # resolved in its own file, before the merge
                source = (path.parent / service["extends"]["file"]).resolve()
                base = yaml.safe_load(source.read_text())["services"][service["extends"]["service"]]
                service = merge(copy.deepcopy(base), {k: v for k, v in service.items() if k != "extends"})
            top["services"][service_name] = service
        model = merge(model, {k: v for k, v in top.items() if not k.startswith("x-")})
    return interpolate(model, env)


@pytest.fixture(scope="module", params=["production", "cpu"])
def model(request: pytest.FixtureRequest) -> dict[str, Any]:
    return merged(PRODUCTION if request.param == "production" else CPU)


def schema_errors(path: Path) -> str | None:
    tool = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    done = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(path)], capture_output=True, text=True, timeout=120
    )
    return None if done.returncode == 0 else done.stdout + done.stderr


def test_the_merged_files_are_valid_against_the_compose_specification(model: dict, tmp_path: Path) -> None:
    path = tmp_path / "merged.yaml"
    path.write_text(yaml.safe_dump(model))
    assert schema_errors(path) is None, schema_errors(path)


def test_the_database_password_is_required_not_defaulted() -> None:
    with pytest.raises(AssertionError, match="RAG_POSTGRES_PASSWORD is required"):
        merged(PRODUCTION, env={})


def test_every_long_running_service_has_a_healthcheck_and_restarts(model: dict) -> None:
    services = model["services"]
    assert {"postgres", "migrate", *REPLICAS, "balancer"} <= set(services)
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no", name
            assert "healthcheck" not in service, name
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), name
        assert service.get("restart") == "unless-stopped", name


def test_depends_on_waits_for_the_database_and_its_schema(model: dict) -> None:
    services = model["services"]
    for name, service in services.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in services and dep != name, (name, dep)
            if name == "balancer":
                # HAProxy checks the replicas itself: it needs them started, not healthy
                assert spec["condition"] == "service_started", (name, dep)
            else:
                want = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
                assert spec["condition"] == want, (name, dep)
    # The one-shot waits for the server itself (podman 4.3 cannot start a service whose finished one-shot
    # dependency has dependencies of its own), longer than postgres's health check gives it to start.
    assert "depends_on" not in services["migrate"]
    check = services["postgres"]["healthcheck"]
    allowed = seconds(check["start_period"]) + check["retries"] * seconds(check["interval"])
    command = services["migrate"]["command"]
    assert float(command[command.index("--wait") + 1]) >= allowed
    for name in REPLICAS:
        assert set(services[name]["depends_on"]) == {"llm", "embed", "chroma", "postgres", "migrate"}, name
    assert set(services["balancer"]["depends_on"]) == set(REPLICAS)


def test_each_replica_names_its_dependencies_and_restart_itself_not_through_extends() -> None:
    # podman-compose gives a service that `extends` another its own depends_on alone (a replica started
    # before Chroma was healthy) and not always the restart policy: the replica file says both itself.
    base = load(COMPOSE)["services"]["api"]
    services = load(DOCKER / "compose.replicas.yaml")["services"]
    for name in REPLICAS:
        assert set(base["depends_on"]) <= set(services[name]["depends_on"]), name
        assert services[name]["restart"] == "unless-stopped", name


def test_the_replicas_are_one_service_written_three_times(model: dict) -> None:
    services = model["services"]
    api = services["api"]
    for name in REPLICAS[1:]:
        assert services[name] == api, name  # the CPU variant too: compose.replicas-cpu.yaml keeps them equal
    assert ("data", "/data", False) in named_volumes(api)  # uploads in progress, page images, the BM25 index
    assert api["command"] == ["rag", "serve-api"]


def test_only_the_balancer_is_published_on_the_port_the_api_was(model: dict) -> None:
    services = model["services"]
    published = {name for name, s in services.items() if s.get("ports")}
    assert published == {"balancer"}
    single = interpolate(yaml.safe_load(COMPOSE.read_text())["services"]["api"]["ports"], ENV)
    assert services["balancer"]["ports"] == single


def test_every_replica_environment_is_valid_settings_on_the_database(
    model: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = model["services"]
    postgres = environment(services["postgres"])
    for name in (*REPLICAS, "migrate"):
        with monkeypatch.context() as env:
            for key, value in environment(services[name]).items():
                env.setenv(key, value)
            settings = Settings(_env_file=None)
        url = urlparse(settings.database_url or "")
        assert (url.scheme, url.hostname, url.port) == ("postgresql", "postgres", 5432), name
        assert (url.username, url.password, url.path) == (
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
            "/" + postgres["POSTGRES_DB"],
        ), name
        if name != "migrate":
            assert settings.chroma_mode == "server" and settings.chroma_url == "http://chroma:8000", name
            assert settings.vector_store == "chroma", name
            assert "balancer" in settings.host_names, name


def test_migrate_runs_our_schema_upgrade_on_the_app_image(model: dict) -> None:
    services = model["services"]
    migrate = services["migrate"]
    assert migrate["image"] == services["api"]["image"]
    assert migrate["build"] == services["api"]["build"]
    command = migrate["command"]
    assert command[:3] == ["rag", "db", "upgrade"]
    assert CliRunner().invoke(cli, [*command[1:], "--help"]).exit_code == 0


def test_postgres_keeps_its_cluster_in_a_volume_and_checks_what_the_replicas_use(model: dict) -> None:
    services = model["services"]
    postgres = services["postgres"]
    assert ("postgres", "/var/lib/postgresql", False) in named_volumes(postgres)
    assert "postgres" in model["volumes"]
    dockerfile = (ROOT / postgres["build"]["dockerfile"]).read_text()
    assert "PGDATA=/var/lib/postgresql/18/docker" in dockerfile  # inside the volume
    test = postgres["healthcheck"]["test"]
    env = environment(postgres)
    assert test[1] == "pg_isready"
    assert test[test.index("-U") + 1] == env["POSTGRES_USER"] and test[test.index("-d") + 1] == env["POSTGRES_DB"]
    assert "postgres" not in {s for s, v in services.items() if v.get("ports")}


def test_the_balancer_config_is_the_one_rag_up_writes_for_these_replicas(model: dict) -> None:
    services = model["services"]
    port = int(environment(services["api"])["RAG_API_PORT"])
    expected = haproxy_config(
        "0.0.0.0", port, [(name, port) for name in REPLICAS], check_host="localhost", resolve=True, maxconn=None
    )
    written = "".join(
        line for line in (DOCKER / "haproxy.cfg").read_text().splitlines(True) if not line.startswith("#")
    )
    assert written == expected
    assert services["balancer"]["ports"][0].endswith(f":{port}")
    assert (
        "COPY docker/haproxy.cfg /etc/haproxy/haproxy.cfg"
        in (ROOT / services["balancer"]["build"]["dockerfile"]).read_text()
    )
    # The check's Host is one every replica answers to.
    assert "localhost" in Settings(_env_file=None).host_names


def test_haproxy_accepts_the_config() -> None:
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if haproxy is None:
        pytest.skip("haproxy is not installed (scripts/setup.sh --test installs it)")
    done = subprocess.run(
        [haproxy, "-c", "-f", str(DOCKER / "haproxy.cfg")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_cpu_file_gives_the_other_replicas_what_compose_cpu_gives_api() -> None:
    cpu_api = environment(load(DOCKER / "compose.cpu.yaml")["services"]["api"])
    replicas = load(DOCKER / "compose.replicas.yaml")["services"]
    replicas_cpu = load(DOCKER / "compose.replicas-cpu.yaml")["services"]
    assert set(replicas_cpu) == set(REPLICAS[1:])
    for name, service in replicas_cpu.items():
        assert environment(service) == cpu_api, name
        assert set(service) == {"environment", "ports"}, name
        assert service["ports"] == replicas[name]["ports"] == "!reset", name
