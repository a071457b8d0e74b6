"""The compose overrides for pools, checked statically: two GPUs with one llama-server each
(docker/compose.gpus2.yaml) and a second embedding server on another machine (docker/compose.remote-embed.yaml).

Both are merged here by the Compose specification's rules (mappings merged, `!override` replacing,
`extends` resolved), then checked against the Compose schema and against our own settings.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rag.core.config import Settings
from tests.test_compose import COMPOSE, ROOT, ComposeLoader, environment


def merged(override: Path) -> dict[str, Any]:
    """compose.yaml with `override` over it: mappings merged, tagged values replace, `extends` resolved."""
    base = yaml.safe_load(COMPOSE.read_text())
    top = yaml.load(override.read_text(), Loader=ComposeLoader)
    for name, service in top["services"].items():
        if "extends" in service:
            source = (override.parent / service["extends"]["file"]).resolve()
            assert source == COMPOSE.resolve(), source
            service = _merge(copy.deepcopy(base["services"][service["extends"]["service"]]), _without(service))
            base["services"][name] = service
        else:
            base["services"][name] = _merge(base["services"][name], service)
    return base


def _without(service: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in service.items() if k != "extends"}


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base[k], v) if k in base else v for k, v in over.items()}}
    return over  # ComposeLoader reads `!override` as the plain value: it replaces


def gpu_ids(service: dict[str, Any]) -> list[list[str]]:
    return [d.get("device_ids") for d in service["deploy"]["resources"]["reservations"]["devices"]]


@pytest.fixture(scope="module")
def two_gpus() -> dict[str, Any]:
    return merged(ROOT / "docker" / "compose.gpus2.yaml")


def test_two_gpus_run_one_llama_server_each_with_the_same_flags(two_gpus: dict[str, Any]) -> None:
    services = two_gpus["services"]
    assert gpu_ids(services["llm"]) == [["0"]] and gpu_ids(services["llm2"]) == [["1"]]
    assert services["llm2"]["command"] == services["llm"]["command"]
    assert services["llm2"]["healthcheck"] == services["llm"]["healthcheck"]
    assert services["llm2"]["volumes"] == services["llm"]["volumes"]


def test_two_gpus_put_both_servers_in_the_apis_pool(two_gpus: dict[str, Any]) -> None:
    services = two_gpus["services"]
    env = environment(services["api"])
    settings = Settings(_env_file=None, llm_url=env["RAG_LLM_URL"])
    port = services["llm"]["command"][services["llm"]["command"].index("--port") + 1]
    assert settings.llm_urls == [f"http://llm:{port}", f"http://llm2:{port}"]
    assert services["api"]["depends_on"]["llm2"] == {"condition": "service_healthy"}
    assert services["api"]["depends_on"]["llm"] == {"condition": "service_healthy"}


def test_an_embedding_server_on_another_machine_joins_the_pool() -> None:
    services = merged(ROOT / "docker" / "compose.remote-embed.yaml")["services"]
    value = environment(services["api"])["RAG_EMBED_URL"]
    assert ":?" in value, "the other machine's address is required, not defaulted"
    resolved = re.sub(r"\$\{RAG_REMOTE_EMBED_URL:\?[^}]*\}", "http://10.0.0.7:8082", value)
    assert Settings(_env_file=None, embed_url=resolved).embed_urls == ["http://embed:8082", "http://10.0.0.7:8082"]
    assert services["embed"] == yaml.safe_load(COMPOSE.read_text())["services"]["embed"]


@pytest.mark.parametrize("override", ["compose.gpus2.yaml", "compose.remote-embed.yaml"])
def test_the_merged_file_is_valid_against_the_compose_specification(override: str, tmp_path: Path) -> None:
    model = merged(ROOT / "docker" / override)
    for service in model["services"].values():
        service.pop("extends", None)
    path = tmp_path / "merged.yaml"
    path.write_text(yaml.safe_dump(model))
    tool = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    done = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
