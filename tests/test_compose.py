"""compose.yaml checked statically (no Docker engine here): schema, services, the llm flags, volumes, ports."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from rag.core.config import Settings
from rag.deploy.modellock import find_artifact, load_lock
from rag.deploy.profiles import PROFILES

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
ONE_SHOT = {"models"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def named_volumes(service: dict) -> list[tuple[str, str, bool]]:
    """(volume, mount point, read-only) for each named volume a service mounts."""
    out = []
    for spec in service.get("volumes", []):
        parts = spec.split(":")
        if not parts[0].startswith((".", "/")):
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def test_valid_against_the_compose_specification() -> None:
    tool = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    done = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_services_are_there(services: dict) -> None:
    assert {"models", "llm", "embed", "chroma", "api"} <= set(services)


def test_every_long_running_service_has_a_healthcheck_and_restarts(services: dict) -> None:
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no"
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), name
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name


def test_llm_command_is_the_v100_profile(services: dict) -> None:
    profile = PROFILES["v100-16g"]
    artifact = find_artifact(profile.model)
    assert artifact.profile == "production" and artifact.role == "generator"
    expected = profile.command("llama-server", f"/models/{artifact.file}", "0.0.0.0", 8080)
    assert services["llm"]["command"] == expected
    assert "--metrics" in expected


def test_llm_has_the_gpu_the_model_and_a_health_check(services: dict) -> None:
    llm = services["llm"]
    devices = llm["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert ("models", "/models", True) in named_volumes(llm)
    assert any("127.0.0.1:8080/health" in part for part in llm["healthcheck"]["test"])


def test_dockerfiles_exist_and_build_llama_server_for_volta(services: dict) -> None:
    for name, service in services.items():
        build = service.get("build")
        assert build, name
        assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
    llm = (ROOT / services["llm"]["build"]["dockerfile"]).read_text()
    assert "nvidia/cuda:${CUDA_VERSION}-devel" in llm and "ARG CUDA_VERSION=12." in llm
    assert "scripts/build-llama-server.sh" in llm
    assert "GGML_CUDA=ON" in llm and "CMAKE_CUDA_ARCHITECTURES=70" in llm
    assert "EXTRA_TARGETS" not in llm  # llama-server only


def test_volumes_are_declared_and_used(compose: dict, services: dict) -> None:
    declared = set(compose.get("volumes", {}))
    used = {v for s in services.values() for v, _, _ in named_volumes(s)}
    assert used == declared
    # only the one-shot download writes the models
    for name, service in services.items():
        for volume, mount, read_only in named_volumes(service):
            if volume == "models":
                assert read_only == (name not in ONE_SHOT), name
                assert mount == environment(service).get("RAG_MODELS_DIR", "/models")


def test_depends_on_names_defined_services_with_conditions(services: dict) -> None:
    for name, service in services.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in services and dep != name
            want = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
            assert spec["condition"] == want, (name, dep)
    assert set(services["api"]["depends_on"]) == {"llm", "embed", "chroma"}


def container_port(service: dict, command_flag: str) -> int:
    command = service["command"]
    return int(command[command.index(command_flag) + 1])


def test_urls_and_ports_agree(services: dict) -> None:
    api_env = environment(services["api"])
    targets = {
        "RAG_LLM_URL": ("llm", container_port(services["llm"], "--port")),
        "RAG_EMBED_URL": ("embed", container_port(services["embed"], "--port")),
        "RAG_CHROMA_URL": ("chroma", container_port(services["chroma"], "--port")),
    }
    for key, (host, port) in targets.items():
        url = urlparse(api_env[key])
        assert (url.hostname, url.port) == (host, port), key
    assert environment(services["embed"])["RAG_EMBED_URL"] == api_env["RAG_EMBED_URL"]
    published = services["api"]["ports"][0].rsplit(":", 1)[1]
    assert int(published) == int(api_env["RAG_API_PORT"])
    for name in ("llm", "embed", "chroma"):
        assert "ports" not in services[name], f"{name} stays on the compose network"


def test_api_environment_is_valid_settings(services: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in environment(services["api"]).items():
        monkeypatch.setenv(key, value)
    settings = Settings(_env_file=None)
    assert settings.chroma_mode == "server" and settings.chroma_url == "http://chroma:8000"
    assert settings.context_budget == PROFILES[settings.llm_profile].slot_ctx


def test_models_service_pulls_every_production_file(services: dict) -> None:
    command = " ".join(services["models"]["command"])
    production = {a.name for a in load_lock() if a.profile == "production"}
    pulled = set(command.split("for name in", 1)[1].split(";", 1)[0].split())
    assert pulled == production
    assert all(find_artifact(name).url for name in pulled)
    embed_dir = environment(services["embed"])["RAG_EMBED_MODEL_PATH"]
    embedder_files = [a.file for a in load_lock() if a.profile == "production" and a.role == "embedder"]
    assert embedder_files and all(f"/models/{f}".startswith(embed_dir + "/") for f in embedder_files)
    assert any(f.endswith("modules.json") for f in embedder_files)  # a sentence-transformers folder


class ComposeLoader(yaml.SafeLoader):
    """YAML with the Compose specification's merge tags (`!reset`, `!override`)."""


ComposeLoader.add_constructor("!reset", lambda loader, node: "!reset")


def _overriding(loader: ComposeLoader, node: yaml.Node) -> Any:
    """An `!override` value as the plain value it tags (a mapping, a sequence or a scalar)."""
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


ComposeLoader.add_constructor("!override", _overriding)


@pytest.fixture(scope="module")
def cpu_override() -> dict:
    return yaml.load((ROOT / "docker" / "compose.cpu.yaml").read_text(), Loader=ComposeLoader)["services"]


def test_cpu_override_replaces_only_the_gpu_and_the_models(cpu_override: dict, services: dict) -> None:
    assert set(cpu_override) <= set(services)
    allowed = {
        "models": {"command", "environment"},
        "llm": {"build", "image", "command", "healthcheck", "deploy"},
        "embed": {"environment", "healthcheck"},
        "api": {"environment"},
    }
    for name, service in cpu_override.items():
        assert set(service) <= allowed[name], name
    assert cpu_override["llm"]["deploy"] == "!reset"
    assert cpu_override["llm"]["build"]["args"]["GGML_CUDA"] == "OFF"
    # The models job prepares the embedder the variant serves, so it rebuilds no other.
    assert environment(cpu_override["models"]) == {
        "RAG_EMBED_MODEL": environment(cpu_override["embed"])["RAG_EMBED_MODEL"]
    }
    assert set(environment(cpu_override["api"])) == {
        "RAG_LLM_MODEL",
        "RAG_LLM_PROFILE",
        "RAG_LLM_PROMPT_STYLE",
        "RAG_EMBED_MODEL",
    }


def test_cpu_override_runs_the_cpu_profile_on_the_bundled_models(cpu_override: dict, services: dict) -> None:
    generator = next(a for a in load_lock() if a.role == "generator" and a.profile == "embedded")
    api = {**environment(services["api"]), **environment(cpu_override["api"])}
    expected = PROFILES[api["RAG_LLM_PROFILE"]].command("llama-server", f"/models/{generator.file}", "0.0.0.0", 8080)
    assert cpu_override["llm"]["command"] == expected + ["-a", api["RAG_LLM_MODEL"]]
    assert api["RAG_LLM_MODEL"] == generator.name
    embed = environment(cpu_override["embed"])
    assert embed["RAG_EMBED_MODEL"] == api["RAG_EMBED_MODEL"]
    assert embed["RAG_EMBED_MODEL_PATH"] in " ".join(cpu_override["models"]["command"])


def test_the_app_image_creates_and_owns_every_mount_point_its_services_write(services: dict) -> None:
    app = (ROOT / "docker" / "app.Dockerfile").read_text()
    written = {
        mount
        for name, s in services.items()
        if s.get("build", {}).get("dockerfile") == "docker/app.Dockerfile"
        for _, mount, read_only in named_volumes(s)
        if not read_only
    }
    assert written == {"/models", "/data", "/chroma"}
    assert f"mkdir -p {' '.join(sorted(written, key=['/models', '/data', '/chroma'].index))}" in app
    assert app.index("chown rag:rag") < app.index("USER rag")


def test_the_api_answers_to_its_service_name_and_its_published_address(services: dict) -> None:
    env = environment(services["api"])
    allowed = re.sub(r"\$\{RAG_ALLOWED_HOSTS:-([^}]*)\}", r"\1", env["RAG_ALLOWED_HOSTS"])
    settings = Settings(_env_file=None, api_host=env["RAG_API_HOST"], allowed_hosts=allowed)
    published_host = services["api"]["ports"][0].split(":-", 1)[1].split(":", 1)[0]
    assert {"api", published_host, "localhost"} <= settings.host_names
